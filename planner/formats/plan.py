"""The Plan format: schedule, micro-batching, stages with replicas, per-layer memory policy.

Schedules (per step of ``num_microbatches`` micro-batches; F = forward, B = backward):

``gpipe``      every stage runs all forwards, then all backwards; flush and update.
``1f1b``       synchronous 1F1B: stage s runs (W_s - 1) // r_s warm-up forwards, then
               alternates one forward and one backward, then drains; flush and update.
``pipedream``  asynchronous 1F1B (PipeDream §3.3): the same order without a flush; every
               backward is followed by that stage's update, and weight stashing keeps one
               weight version per micro-batch in flight. ``vertical_sync`` makes every stage
               use the version the first stage used.
``interleaved-1f1b``  Megatron-LM's interleaved 1F1B: each of p devices holds
               ``virtual_stages`` (v) chunks of layers; ``stages`` lists the p x v chunks
               in pipeline order and chunk c runs on device c mod p, so a device's chunks
               are not adjacent. Micro-batches go round in groups of p, depth first.
               Needs one replica per chunk and ``num_microbatches`` a multiple of p.
``zero-bubble``  ZB-H1 (Zero Bubble, ICLR'24): 1F1B's order with each backward split into
               its input-gradient half (B, sent on at once) and its weight-gradient half
               (W); stage s defers its W by s backwards, so the later stages, idle at the
               end of 1F1B, spend that time on their deferred W. One replica per stage.

W_s counts the workers of stages s..end and r_s is stage s's replicas, as in PipeDream's
runtime; with one replica per stage the warm-up is p - s - 1 forwards.
"""

from dataclasses import dataclass
from typing import Literal, get_args

from pydantic import BaseModel, Field, model_validator

from pipestudio.planner.errors import PlanError
from pipestudio.planner.formats.documents import (
    MAX_LAYERS,
    MAX_REPLICAS,
    MAX_STAGES,
    STRICT,
    DeviceIdx,
    Document,
    MicrobatchSize,
    Name,
    NumMicrobatches,
    Precision,
    Provenance,
    Replicas,
    VirtualStages,
    parse_document,
)
from pipestudio.planner.formats.profile import Profile

Schedule = Literal["gpipe", "1f1b", "pipedream", "interleaved-1f1b", "zero-bubble"]
Optimizer = Literal["sgd", "momentum", "adam"]
Policy = Literal["keep", "recompute", "swap"]

SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)
#: The schedules the planners plan for (``algorithms/request.py``); plans of the others are
#: made by hand or from a template (``plan_template``).
PLANNED_SCHEDULES: tuple[Schedule, ...] = ("gpipe", "1f1b", "pipedream")
POLICIES: tuple[Policy, ...] = get_args(Policy)

#: Bytes of optimizer state kept per byte of parameters (momentum buffer; Adam's two moments).
OPTIMIZER_STATE_FACTOR: dict[str, int] = {"sgd": 0, "momentum": 1, "adam": 2}


class Stage(BaseModel):
    """A contiguous part of the pipeline and where its replicas run."""

    model_config = STRICT

    layers: list[Name] = Field(
        min_length=1, max_length=MAX_LAYERS, description="Names of the layers in this stage."
    )
    replicas: Replicas = Field(1, description="Data-parallel copies of this stage.")
    devices: list[DeviceIdx] | None = Field(
        None,
        max_length=MAX_REPLICAS,
        description="Cluster device index of each replica; null = assigned in order.",
    )


class Plan(Document):
    """How to run a profiled model as a pipeline (see the module docstring)."""

    format: Literal["pipestudio.plan"] = "pipestudio.plan"
    version: Literal[1] = 1
    model: Name = Field(min_length=1, description="Model name, as in the profile.")
    schedule: Schedule
    vertical_sync: bool = Field(False, description="PipeDream's vertical sync (pipedream only).")
    virtual_stages: VirtualStages = Field(
        1,
        description="Chunks per device (interleaved-1f1b only): stages lists devices x "
        "virtual_stages chunks, and chunk c runs on device c mod devices.",
    )
    num_microbatches: NumMicrobatches = Field(description="Micro-batches per step.")
    microbatch_size: MicrobatchSize = Field(description="Samples per micro-batch.")
    optimizer: Optimizer = "adam"
    precision: Precision = Field(
        "fp32",
        description="Arithmetic to train in, as the profile was measured: fp32, tf32, "
        "bf16 or fp16.",
    )
    stages: list[Stage] = Field(
        min_length=1, max_length=MAX_STAGES, description="Stages in pipeline order."
    )
    policies: dict[Name, Policy] = Field(
        default_factory=dict,
        max_length=MAX_LAYERS,
        description="Memory policy per layer name; absent means keep.",
    )
    provenance: Provenance = Field(
        default_factory=dict, description="Who or what made the plan, and with which settings."
    )

    @model_validator(mode="after")
    def _check_plan(self) -> "Plan":
        if self.vertical_sync and self.schedule != "pipedream":
            raise ValueError(
                f"vertical_sync applies to the pipedream schedule only, not {self.schedule!r}"
            )
        self._check_schedule()
        for stage_idx, stage in enumerate(self.stages):
            if stage.devices is not None and len(stage.devices) != stage.replicas:
                raise ValueError(
                    f"stage {stage_idx} has {stage.replicas} replicas but "
                    f"{len(stage.devices)} devices {stage.devices}"
                )
            if self.num_microbatches % stage.replicas:
                raise ValueError(
                    f"stage {stage_idx} has {stage.replicas} replicas, which do not divide "
                    f"num_microbatches={self.num_microbatches} evenly"
                )
        return self

    def _check_schedule(self) -> None:
        """The constraints of the schedules that need them (module docstring)."""
        schedule, chunks = self.schedule, self.virtual_stages
        if chunks > 1 and schedule != "interleaved-1f1b":
            raise ValueError(
                f"virtual_stages={chunks} applies to interleaved-1f1b only, not {schedule!r}"
            )
        if schedule not in ("interleaved-1f1b", "zero-bubble"):
            return
        replicated = [idx for idx, stage in enumerate(self.stages) if stage.replicas > 1]
        if replicated:
            raise ValueError(
                f"{schedule} runs one replica per stage; stage {replicated[0]} has "
                f"{self.stages[replicated[0]].replicas}"
            )
        if schedule == "zero-bubble":
            return
        if len(self.stages) % chunks:
            raise ValueError(
                f"interleaved-1f1b with virtual_stages={chunks} needs a multiple of "
                f"{chunks} stages (devices x chunks), got {len(self.stages)}"
            )
        devices = len(self.stages) // chunks
        if self.num_microbatches % devices:
            raise ValueError(
                f"interleaved-1f1b on {devices} devices needs num_microbatches a multiple "
                f"of {devices} (micro-batches go round in groups of the devices), got "
                f"{self.num_microbatches}"
            )
        for chunk, stage in enumerate(self.stages[devices:], start=devices):
            first = self.stages[chunk % devices]
            if None not in (stage.devices, first.devices) and stage.devices != first.devices:
                raise ValueError(
                    f"stage {chunk} is a chunk of device rank {chunk % devices}, as stage "
                    f"{chunk % devices} is, but names devices {stage.devices}, not "
                    f"{first.devices}"
                )

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def interleaved(self) -> bool:
        return self.schedule == "interleaved-1f1b"

    @property
    def num_workers(self) -> int:
        """Processes the plan runs on: one per stage replica, or, interleaved, one per
        device (stages / virtual_stages)."""
        if self.interleaved:
            return len(self.stages) // self.virtual_stages
        return sum(stage.replicas for stage in self.stages)

    def rank_of_stage(self, stage_idx: int) -> int:
        """The process (device rank) of an interleaved plan that runs chunk ``stage_idx``."""
        return stage_idx % self.num_workers

    def policy(self, layer_name: str) -> str:
        return self.policies.get(layer_name, "keep")

    def worker_devices(self) -> list[list[int]]:
        """Device index of each (stage, replica); unassigned ones follow in order (an
        interleaved plan's chunks take the device of their rank)."""
        if self.interleaved:
            ranks = self.num_workers
            first = [
                list(stage.devices) if stage.devices is not None else None
                for stage in self.stages[:ranks]
            ]
            result = []
            for chunk, stage in enumerate(self.stages):
                own = first[chunk % ranks] or (list(stage.devices) if stage.devices else None)
                result.append(own if own is not None else [chunk % ranks])
            return result
        next_device = 0
        result = []
        for stage in self.stages:
            if stage.devices is not None:
                result.append(list(stage.devices))
            else:
                result.append(list(range(next_device, next_device + stage.replicas)))
            next_device = max(result[-1]) + 1
        return result

    def warmup_forwards(self, stage_idx: int) -> int:
        """Forwards a replica of stage ``stage_idx`` runs before its first backward (1F1B)."""
        later_workers = sum(stage.replicas for stage in self.stages[stage_idx:])
        return (later_workers - 1) // self.stages[stage_idx].replicas

    def all_warmup_forwards(self) -> list[int]:
        """``warmup_forwards`` of every stage, in one pass over the stages."""
        warmups, later_workers = [], 0
        for stage in reversed(self.stages):
            later_workers += stage.replicas
            warmups.append((later_workers - 1) // stage.replicas)
        return warmups[::-1]


@dataclass(frozen=True)
class StageLayout:
    """A plan resolved against its profile: layer indices per stage, stage per layer."""

    stage_layers: tuple[tuple[int, ...], ...]
    stage_of_layer: tuple[int, ...]


def check_precision(precision: str, profiled: str, what: str) -> None:
    """Refuse to plan or predict in another precision than the profile's: its times and
    bytes hold only for the arithmetic they were measured in."""
    if precision != profiled:
        raise PlanError(
            f"{what} asks for precision {precision!r} but the profile was measured "
            f"in {profiled!r}; profile the model with --precision {precision}"
        )


def resolve_plan(plan: Plan, profile: Profile) -> StageLayout:
    """Check that ``plan`` places every layer of ``profile`` exactly once, in pipeline order."""
    if plan.model != profile.model:
        raise PlanError(
            f"the plan is for model {plan.model!r} but the profile is of {profile.model!r}"
        )
    check_precision(plan.precision, profile.precision, "the plan")
    index = profile.layer_index
    stage_of_layer = [-1] * profile.num_layers
    stage_layers = []
    for stage_idx, stage in enumerate(plan.stages):
        indices = []
        for name in stage.layers:
            layer_idx = index.get(name)
            if layer_idx is None:
                raise PlanError(
                    f"stage {stage_idx} names layer {name!r}, which the profile "
                    f"of {profile.model!r} does not have"
                )
            if stage_of_layer[layer_idx] >= 0:
                first = stage_of_layer[layer_idx]
                where = "twice" if first == stage_idx else f"in stage {first} and"
                raise PlanError(
                    f"overlapping stages: layer {name!r} is {where} in stage {stage_idx}"
                )
            stage_of_layer[layer_idx] = stage_idx
            indices.append(layer_idx)
        stage_layers.append(tuple(sorted(indices)))
    missing = [profile.layers[i].name for i, s in enumerate(stage_of_layer) if s < 0]
    if missing:
        shown = ", ".join(repr(name) for name in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise PlanError(f"{len(missing)} layers are in no stage: {shown}{more}")
    for layer_idx, succs in enumerate(profile.graph.succs):
        for succ in succs:
            if stage_of_layer[succ] < stage_of_layer[layer_idx]:
                raise PlanError(
                    f"layer {profile.layers[succ].name!r} in stage {stage_of_layer[succ]} "
                    f"takes input from {profile.layers[layer_idx].name!r} in the later stage "
                    f"{stage_of_layer[layer_idx]}: stages must follow the data flow"
                )
    for name in plan.policies:
        if name not in index:
            raise PlanError(
                f"a policy is given for layer {name!r}, which the profile does not have"
            )
    return StageLayout(tuple(stage_layers), tuple(stage_of_layer))


def plan_template(
    profile: Profile,
    num_stages: int,
    num_microbatches: int,
    schedule: str,
    *,
    microbatch_size: int | None = None,
    optimizer: str = "adam",
    virtual_stages: int = 1,
) -> Plan:
    """Stages with equal layer counts (the first ``n % k`` get one more), all layers kept;
    interleaved, ``num_stages`` devices of ``virtual_stages`` chunks each."""
    chunks = num_stages * virtual_stages
    if not 1 <= chunks <= profile.num_layers:
        what = f"--stages {num_stages}" + (
            f" x --virtual-stages {virtual_stages}" if virtual_stages > 1 else ""
        )
        raise PlanError(f"{what} is not between 1 and the profile's {profile.num_layers} layers")
    if schedule not in SCHEDULES:
        raise PlanError(f"schedule {schedule!r} is unknown; expected one of {', '.join(SCHEDULES)}")
    base, extra = divmod(profile.num_layers, chunks)
    stages, start = [], 0
    for stage_idx in range(chunks):
        size = base + (1 if stage_idx < extra else 0)
        stages.append({"layers": [layer.name for layer in profile.layers[start : start + size]]})
        start += size
    return parse_document(
        Plan,
        {
            "model": profile.model,
            "schedule": schedule,
            "virtual_stages": virtual_stages,
            "num_microbatches": num_microbatches,
            "microbatch_size": microbatch_size or profile.microbatch_size,
            "optimizer": optimizer,
            "precision": profile.precision,
            "stages": stages,
            "policies": {layer.name: "keep" for layer in profile.layers},
            "provenance": {"planner": "template", "num_stages": num_stages},
        },
        source="plan template",
    )
