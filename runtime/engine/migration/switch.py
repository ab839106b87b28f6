"""One rank's part in a live migration: which partition runs each micro-batch, and what moves.

A migration takes effect at a *switch micro-batch* ``M`` (the first of its step): every
rank runs micro-batches before ``M`` on the old partition and from ``M`` on the new one,
so each micro-batch runs wholly on one partition, forward and backward, and every rank
switches at the same, well-defined micro-batch. Micro-batches in flight at the switch
finish where they started, with the activations and stashed versions they already hold:
none of them moves or is recomputed.

The moved layer's state follows the rule of vPipe (Zhao et al., TPDS'22 §4.3): its
parameters go to the new stage after the backward that last updates them on the old one,
i.e. once the old stage has applied the gradients of every micro-batch before ``M``
(the *hand-off*: parameters and buffers, then accumulated gradients and optimizer state,
which the new stage waits for only before its first update). Until then:

- ``gpipe``/``1f1b`` update at the flush; ranks learn of the migration a step ahead
  (``coordinator.py``), so the hand-off is sent right after the old stage's update of the
  step before ``M`` and waited for only before the first forward that runs the layer
  there (the transfer overlaps the old step's tail);
- ``pipedream`` runs on: a forward of ``mb >= M`` on the new stage runs the layer on the
  version PipeDream §3.3 gives it there (the new stage's own count of applied micro-batches,
  or stage 0's under vertical sync), except while that count is still made of the old
  stage's updates only (at most ``M``): then it runs on the older of the versions the two
  stages give ``mb`` (``moved_version``). For a layer moving downstream that is the old
  stage's version, made before the old stage's own forward of ``mb``, which the new
  stage's forward follows, so it is there in time; the new stage's own count would take
  the old stage's update after its backward of a micro-batch before ``M``, which waits for
  the gradient the new stage sends just before that forward (a bubble of a backward, an
  update and a transfer). For a layer moving upstream it is the new stage's count, made by
  the old stage's update right after the backward whose gradient the new stage then runs
  its own backward on before that forward. The old stage sends each such version right
  after the update that makes it (``needed_versions``). No flush, and every micro-batch
  runs forward and backward on one version. Under vertical sync the version is stage 0's
  on every partition, so the run computes exactly what it would without migrating.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from pipestudio.planner.formats.plan import Plan
from pipestudio.runtime.engine.execution.stage import StageRunner
from pipestudio.runtime.engine.layout import EngineLayout, StageIO
from pipestudio.runtime.engine.ops import first_stage_versions, segments, worker_ops


@dataclass
class Partition:
    """The layers a rank runs for micro-batches from ``switch_microbatch`` on."""

    switch_microbatch: int
    plan: Plan
    layout: EngineLayout
    io: StageIO
    runner: StageRunner
    keys: list[tuple[str, str]]  # (runner's positional key, ``layer.param``)

    def qualified(self) -> dict[str, nn.Parameter]:
        return {full: self.runner.params[key] for key, full in self.keys}

    def positional(self, weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return {key: weights[full] for key, full in self.keys}


def runner_keys(runner: StageRunner) -> list[tuple[str, str]]:
    keys = []
    for key in runner.params:
        pos, _, rest = key.partition(".")
        keys.append((key, f"{runner.names[int(pos)]}.{rest}"))
    return keys


@dataclass
class RankMigration:
    """A migration as one rank sees it (module docstring)."""

    migration_id: int
    step: int
    switch_microbatch: int
    outgoing: dict[int, list[str]]  # peer rank -> layers this rank hands to it
    incoming: dict[int, list[str]]  # peer rank -> layers it hands to this rank
    needed: dict[int, set[int]] = field(default_factory=dict)  # peer -> versions to send
    #: peer -> {micro-batch: version older than the switch its layers run on here}; a
    #: forward uses it where it is older than the stage's own version (a layer from upstream)
    older: dict[int, dict[int, int]] = field(default_factory=dict)
    #: (peer, version) -> a version message received, kept for every forward that runs on it
    fetched: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    versions_sent: set[tuple[int, int]] = field(default_factory=set)
    handed_off: set[int] = field(default_factory=set)
    released: bool = False  # the sends waited for and their tensors let go
    received: set[int] = field(default_factory=set)  # peers whose weights are in
    trained: set[int] = field(default_factory=set)  # peers whose optimizer state is in
    wait_ms: float = 0.0
    started_ms: float = 0.0
    sent_bytes: int = 0
    received_bytes: int = 0

    @property
    def done(self) -> bool:
        return self.handed_off == set(self.outgoing) and self.received == self.trained == set(
            self.incoming
        )

    def layers_out(self) -> list[str]:
        return [name for names in self.outgoing.values() for name in names]

    def layers_in(self) -> list[str]:
        return [name for names in self.incoming.values() for name in names]


def exchanges(
    old: EngineLayout, new: EngineLayout, rank: int
) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """(outgoing, incoming) layers of ``rank`` by peer rank (one replica per stage)."""
    stage_idx, _ = old.worker(rank)
    outgoing: dict[int, list[str]] = {}
    incoming: dict[int, list[str]] = {}
    for name, before in old.stage_of.items():
        after = new.stage_of[name]
        if before == after:
            continue
        if before == stage_idx:
            outgoing.setdefault(new.rank_of(after, 0), []).append(name)
        elif after == stage_idx:
            incoming.setdefault(old.rank_of(before, 0), []).append(name)
    return outgoing, incoming


def forward_versions(plan: Plan, stage_idx: int, first_step: int, num_steps: int) -> dict[int, int]:
    """The weight version each forward of a one-replica ``pipedream`` stage runs on over a
    segment, as ``weights.WeightVersions`` chooses it."""
    required = first_stage_versions(plan, first_step, num_steps) if plan.vertical_sync else None
    applied = first_step * plan.num_microbatches
    result = {}
    for op in worker_ops(plan, stage_idx, 0, first_step, num_steps):
        if op.kind == "update":
            applied += 1
        elif op.kind == "forward":
            assert op.microbatch is not None
            wanted = applied if required is None else required[op.microbatch]
            result[op.microbatch] = min(wanted, applied)
    return result


def moved_version(new_version: int, old_version: int, switch_microbatch: int) -> int:
    """The version a forward on a layer's new stage runs a layer moved at ``switch_microbatch`` on,
    given the versions its new and old stages run that micro-batch's forward on (module
    docstring)."""
    return new_version if new_version > switch_microbatch else min(new_version, old_version)


def needed_versions(
    plan: Plan,
    old_stage: int,
    new_stage: int,
    step: int,
    start_step: int,
    end_step: int,
    checkpoint_every: int,
) -> dict[int, int]:
    """For the layers moving from ``old_stage`` to ``new_stage`` at ``step``: the version,
    older than the switch, that each forward of the switch's micro-batches or later on the
    new stage runs them on (``pipedream``; empty for the others and where none is older)."""
    if plan.schedule != "pipedream":
        return {}
    switch_microbatch = step * plan.num_microbatches
    for first, count in segments(plan, start_step, end_step, checkpoint_every):
        if first <= step < first + count:
            new = forward_versions(plan, new_stage, first, count)
            old = forward_versions(plan, old_stage, first, count)
            result = {
                mb: moved_version(version, old[mb], switch_microbatch)
                for mb, version in new.items()
                if mb >= switch_microbatch
            }
            return {mb: version for mb, version in result.items() if version < switch_microbatch}
    return {}
