"""The Proposal format: a repartition of a running job, what it moves, and whether it pays.

The online planner (``replan/online.py``) writes one when measurements drift from the profile a
plan was made for; the backend stores it, the dashboard shows it and, once approved, the
runtime executes its ``moves`` the way vPipe (Zhao et al., TPDS'22) migrates boundary
layers between stages without restarting training. ``new_plan`` is a complete Plan that runs
as is: same schedule, micro-batches, optimizer, stages, replicas and devices as the current
plan; only which stage holds which layer, and the layers' memory policies, change.

Migration cost (``replan/migration.py``): every moved layer sends its parameters, their gradients
and its optimizer state (0, 1 or 2 bytes per parameter byte for sgd, momentum, adam) from
each replica of its old stage to a replica of its new one; under ``pipedream`` also the
weight versions its old stage stashes besides the live one (PipeDream §3.3). Transfers
between different device pairs run in parallel, those between one pair (in one direction)
one after another, so ``migration_ms`` is the busiest pair's total; without a cluster links
are free and it is 0.
"""

import math
from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from pipestudio.planner.formats.documents import (
    MAX_CANDIDATES,
    MAX_LAYERS,
    MAX_SIMULATED_STEPS,
    MAX_STAGES,
    MAX_TRANSFERS,
    STRICT,
    Bytes,
    DeviceIdx,
    Document,
    Integral,
    Name,
    StageIdx,
    Text,
    TotalMilliseconds,
)
from pipestudio.planner.formats.plan import Plan, Policy, Schedule, Stage


class _Strict(BaseModel):
    model_config = STRICT


class LayerMove(_Strict):
    """A layer that changes stage (stage indices as in both plans)."""

    layer: Name = Field(min_length=1)
    from_stage: StageIdx
    to_stage: StageIdx


class PolicyChange(_Strict):
    """A layer whose keep/recompute/swap policy changes."""

    layer: Name = Field(min_length=1)
    from_policy: Policy
    to_policy: Policy


class MigrationBreakdown(_Strict):
    """Bytes the migration sends, by kind (summed over moved layers and replicas)."""

    parameter_bytes: Bytes
    gradient_bytes: Bytes
    optimizer_bytes: Bytes
    weight_version_bytes: Bytes = Field(description="Stashed weight versions (pipedream).")


class Transfer(_Strict):
    """What one replica of a stage sends to one replica of another."""

    from_stage: StageIdx
    to_stage: StageIdx
    from_device: DeviceIdx
    to_device: DeviceIdx
    layers: list[Name] = Field(min_length=1, max_length=MAX_LAYERS)
    transfer_bytes: Bytes
    transfer_ms: TotalMilliseconds


class Hysteresis(_Strict):
    """When a repartition is worth doing: both conditions must hold (``replan/online.py``)."""

    max_payback_steps: float = Field(
        gt=0, allow_inf_nan=False, description="The gain must repay the migration within."
    )
    min_gain_fraction: float = Field(
        ge=0, lt=1, allow_inf_nan=False, description="Least relative step-time gain."
    )


class CandidateSummary(_Strict):
    """One repartition the online planner considered; numbers are null when it had none."""

    name: Name
    step_time_ms: float | None = None
    gain_ms: float | None = None
    migration_bytes: Bytes | None = None
    migration_ms: float | None = None
    net_gain_ms: float | None = Field(
        None, description="gain_ms - migration_ms / max_payback_steps: the ranking value."
    )
    num_moves: Annotated[int, Field(ge=0, le=MAX_LAYERS), Integral] | None = None
    note: Text = ""


class Proposal(Document):
    """A repartition of a running job and its evaluation (see the module docstring)."""

    format: Literal["pipestudio.proposal"] = "pipestudio.proposal"
    version: Literal[1] = 1
    model: Name = Field(min_length=1)
    schedule: Schedule
    algorithm: Name = Field(description="The candidate proposed; 'current' when none is.")
    current_stages: list[Stage] = Field(
        min_length=1, max_length=MAX_STAGES, description="The running plan's stages."
    )
    new_plan: Plan = Field(description="The plan after the repartition, executable as is.")
    moves: list[LayerMove] = Field(
        max_length=MAX_LAYERS, description="Layers whose stage changes, in layer order."
    )
    policy_changes: list[PolicyChange] = Field(max_length=MAX_LAYERS)
    step_time_now_ms: TotalMilliseconds = Field(description="Current plan on the observed profile.")
    step_time_after_ms: TotalMilliseconds = Field(description="New plan on the observed profile.")
    gain_ms: float = Field(allow_inf_nan=False, description="Step time saved per step.")
    gain_fraction: float = Field(allow_inf_nan=False, description="gain_ms / step_time_now_ms.")
    migration_bytes: Bytes
    migration_breakdown: MigrationBreakdown
    transfers: list[Transfer] = Field(max_length=MAX_TRANSFERS)
    migration_ms: TotalMilliseconds
    payback_steps: float | None = Field(
        description="migration_ms / gain_ms; null when nothing is gained."
    )
    hysteresis: Hysteresis
    simulated_steps: Annotated[int, Field(ge=1, le=MAX_SIMULATED_STEPS), Integral] = Field(
        description="Steps simulated for each step time."
    )
    worthwhile: bool
    reason: Text = Field(min_length=1)
    candidates: list[CandidateSummary] = Field(default_factory=list, max_length=MAX_CANDIDATES)

    @model_validator(mode="after")
    def _check_consistency(self) -> "Proposal":
        _check_plans(self)
        _check_moves(self)
        _check_numbers(self)
        return self


def _check_plans(proposal: Proposal) -> None:
    new = proposal.new_plan
    if new.model != proposal.model or new.schedule != proposal.schedule:
        raise ValueError(
            f"new_plan is for {new.model!r} under {new.schedule!r} but the "
            f"proposal for {proposal.model!r} under {proposal.schedule!r}"
        )
    if len(new.stages) != len(proposal.current_stages):
        raise ValueError(
            f"new_plan has {len(new.stages)} stages but current_stages "
            f"{len(proposal.current_stages)}: a repartition keeps the stages"
        )
    for idx, (old, now) in enumerate(zip(proposal.current_stages, new.stages, strict=True)):
        if (old.replicas, old.devices) != (now.replicas, now.devices):
            raise ValueError(
                f"stage {idx} runs {old.replicas} replicas on {old.devices} now "
                f"but {now.replicas} on {now.devices} in new_plan: a repartition "
                "keeps replicas and devices"
            )


def _stage_of(stages: list[Stage]) -> dict[str, int]:
    return {name: idx for idx, stage in enumerate(stages) for name in stage.layers}


def _check_moves(proposal: Proposal) -> None:
    before, after = _stage_of(proposal.current_stages), _stage_of(proposal.new_plan.stages)
    if set(before) != set(after):
        odd = sorted(set(before) ^ set(after))[:5]
        raise ValueError(f"current_stages and new_plan hold different layers, e.g. {odd}")
    changed = {name: (before[name], after[name]) for name in before if before[name] != after[name]}
    listed = {move.layer: (move.from_stage, move.to_stage) for move in proposal.moves}
    if listed != changed:
        wrong = sorted(set(listed.items()) ^ set(changed.items()))[:3]
        raise ValueError(
            f"moves must list exactly the layers whose stage changes "
            f"(layer, (from_stage, to_stage)); these differ: {wrong}"
        )


def _check_numbers(proposal: Proposal) -> None:
    breakdown = proposal.migration_breakdown
    kinds = (
        breakdown.parameter_bytes
        + breakdown.gradient_bytes
        + breakdown.optimizer_bytes
        + breakdown.weight_version_bytes
    )
    sent = sum(transfer.transfer_bytes for transfer in proposal.transfers)
    if not kinds == sent == proposal.migration_bytes:
        raise ValueError(
            f"migration_bytes = {proposal.migration_bytes} but its breakdown sums "
            f"to {kinds} and the transfers to {sent}"
        )
    expected = proposal.step_time_now_ms - proposal.step_time_after_ms
    if not math.isclose(proposal.gain_ms, expected, rel_tol=1e-9, abs_tol=1e-9):
        raise ValueError(
            f"gain_ms = {proposal.gain_ms} but step_time_now_ms - step_time_after_ms = {expected}"
        )
    if proposal.worthwhile and not proposal.gain_ms > 0:
        raise ValueError(f"a proposal with gain_ms = {proposal.gain_ms} cannot be worthwhile")
