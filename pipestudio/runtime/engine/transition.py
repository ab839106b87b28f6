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

- ``gpipe``/``1f1b`` update at the flush, so the hand-off is sent as soon as the rank
  learns of the migration at the step boundary, and waited for only before the first
  forward that runs the layer there (the transfer overlaps the old step's tail);
- ``pipedream`` runs on: a forward of ``mb >= M`` on the new stage runs the layer on the
  version PipeDream §3.3 gives it there (the new stage's own count of applied micro-batches,
  or stage 0's under vertical sync), and when that version was made by the old stage's
  last updates, the old stage sends it right after the update that makes it
  (``needed_versions``). No flush, and no micro-batch runs any layer on another version than
  weight stashing gives it on the partition it runs on. Under vertical sync that version is
  the same on every partition, so the run computes exactly what it would without migrating.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import Tensor, nn

from pipestudio.planner.plan import Plan
from pipestudio.runtime.engine.layout import EngineLayout, StageIO
from pipestudio.runtime.engine.ops import first_stage_versions, segments, worker_ops
from pipestudio.runtime.engine.stage import StageRunner


@dataclass
class Partition:
    """The layers a rank runs for micro-batches from ``switch_mb`` on."""

    switch_mb: int
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
class Transition:
    """A migration as one rank sees it (module docstring)."""

    migration_id: int
    step: int
    switch_mb: int
    outgoing: dict[int, list[str]]  # peer rank -> layers this rank hands to it
    incoming: dict[int, list[str]]  # peer rank -> layers it hands to this rank
    needed: dict[int, set[int]] = field(default_factory=dict)  # peer -> versions to send
    versions_sent: set[tuple[int, int]] = field(default_factory=set)
    handed_off: set[int] = field(default_factory=set)
    received: set[int] = field(default_factory=set)  # peers whose weights are in
    trained: set[int] = field(default_factory=set)  # peers whose optimizer state is in
    wait_ms: float = 0.0
    started_ms: float = 0.0
    sent_bytes: int = 0
    received_bytes: int = 0

    @property
    def done(self) -> bool:
        return (self.handed_off == set(self.outgoing)
                and self.received == self.trained == set(self.incoming))

    def layers_out(self) -> list[str]:
        return [name for names in self.outgoing.values() for name in names]

    def layers_in(self) -> list[str]:
        return [name for names in self.incoming.values() for name in names]


def exchanges(old: EngineLayout, new: EngineLayout, rank: int
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


def forward_versions(plan: Plan, stage_idx: int, first_step: int, num_steps: int
                     ) -> dict[int, int]:
    """The weight version each forward of a one-replica ``pipedream`` stage runs on over a
    segment, as ``weights.WeightVersions`` chooses it."""
    required = (first_stage_versions(plan, first_step, num_steps) if plan.vertical_sync
                else None)
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


def needed_versions(plan: Plan, stage_idx: int, step: int, start_step: int, end_step: int,
                    checkpoint_every: int) -> set[int]:
    """Versions older than the switch that stage ``stage_idx`` runs a forward of the
    switch's micro-batches or later on (``pipedream``; empty for the others)."""
    if plan.schedule != "pipedream":
        return set()
    switch_mb = step * plan.num_microbatches
    for first, count in segments(plan, start_step, end_step, checkpoint_every):
        if first <= step < first + count:
            versions = forward_versions(plan, stage_idx, first, count)
            return {v for mb, v in versions.items() if mb >= switch_mb and v < switch_mb}
    return set()
