"""The engine's view of a plan: which layers, tensors and ranks every stage has.

Ranks are numbered stage by stage: stage 0's replicas first, then stage 1's, and so on;
under ``interleaved-1f1b`` rank d runs every chunk c with c mod p = d (p ranks), so the
(stage, replica) workers outnumber the ranks.
A tensor made by a layer of stage a and read by layers of a later stage c goes straight
from a to c (torchgpipe's portals, Kim et al. 2020 §3.3), once per destination stage however
many layers there read it, exactly as the simulator counts boundary bytes
(``pipestudio.planner.simulator.costs.boundary_bytes``). Micro-batch ``mb`` runs on replica
``mb % replicas`` of every stage, as in the simulator. The data (``"input"``) is never
sent: every stage that reads it draws it from the model's deterministic ``sample``.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipestudio.planner.formats.plan import Plan
from pipestudio.runtime.engine.errors import EngineError

DATA = "input"


@dataclass(frozen=True)
class Transfer:
    """One tensor sent per micro-batch: ``layer``'s output from ``src_stage`` to ``dst_stage``."""

    layer: str
    layer_idx: int
    src_stage: int
    dst_stage: int


@dataclass(frozen=True)
class StageIO:
    """A stage's layers (in model order) and the tensors it receives and sends."""

    layers: tuple[str, ...]
    receives: tuple[Transfer, ...]
    sends: tuple[Transfer, ...]
    reads_data: bool
    has_loss: bool
    policies: Mapping[str, str]


class EngineLayout:
    """A plan checked against a model's layers and graph (see the module docstring)."""

    def __init__(
        self,
        plan: Plan,
        model_name: str,
        layer_names: Sequence[str],
        graph_inputs: Mapping[str, Sequence[str]],
    ) -> None:
        if plan.model != model_name:
            raise EngineError(
                f"the plan is for model {plan.model!r} but the model built is {model_name!r}"
            )
        self.plan = plan
        self.layer_index = {name: idx for idx, name in enumerate(layer_names)}
        self.stage_of = _stage_of_layers(plan, layer_names, self.layer_index)
        _check_flow(self.stage_of, graph_inputs)
        last = layer_names[-1]
        if self.stage_of[last] != plan.num_stages - 1:
            raise EngineError(
                f"the model's output layer {last!r} is in stage "
                f"{self.stage_of[last]}, not in the last stage "
                f"{plan.num_stages - 1}, which computes the loss"
            )
        self.stages = [
            self._stage_io(idx, layer_names, graph_inputs) for idx in range(plan.num_stages)
        ]
        #: Every (stage, replica), in pipeline order, and the rank that runs it.
        self.workers = [
            (stage_idx, replica)
            for stage_idx, stage in enumerate(plan.stages)
            for replica in range(stage.replicas)
        ]
        if plan.interleaved:
            self._rank = {worker: plan.rank_of_stage(worker[0]) for worker in self.workers}
        else:
            self._rank = {worker: rank for rank, worker in enumerate(self.workers)}
        self._of_rank: list[list[tuple[int, int]]] = [[] for _ in range(plan.num_workers)]
        for worker in self.workers:
            self._of_rank[self._rank[worker]].append(worker)

    def _stage_io(
        self, stage_idx: int, layer_names: Sequence[str], graph_inputs: Mapping[str, Sequence[str]]
    ) -> StageIO:
        mine = [name for name in layer_names if self.stage_of[name] == stage_idx]
        receives: dict[str, Transfer] = {}
        sends: dict[tuple[int, str], Transfer] = {}
        for reader in layer_names:
            for src in graph_inputs[reader]:
                if src == DATA or self.stage_of[src] == self.stage_of[reader]:
                    continue
                transfer = Transfer(
                    src, self.layer_index[src], self.stage_of[src], self.stage_of[reader]
                )
                if transfer.dst_stage == stage_idx:
                    receives[src] = transfer
                if transfer.src_stage == stage_idx:
                    sends[(transfer.dst_stage, src)] = transfer
        return StageIO(
            layers=tuple(mine),
            receives=tuple(sorted(receives.values(), key=lambda t: (t.src_stage, t.layer_idx))),
            sends=tuple(sorted(sends.values(), key=lambda t: (t.dst_stage, t.layer_idx))),
            reads_data=any(DATA in graph_inputs[name] for name in mine),
            has_loss=stage_idx == self.plan.num_stages - 1,
            policies={name: self.plan.policy(name) for name in mine},
        )

    @property
    def world_size(self) -> int:
        return self.plan.num_workers

    def rank_of(self, stage_idx: int, replica: int) -> int:
        return self._rank[(stage_idx, replica)]

    def worker(self, rank: int) -> tuple[int, int]:
        """(stage, replica) of ``rank`` (its first chunk, interleaved)."""
        return self._of_rank[rank][0]

    def workers_of(self, rank: int) -> list[tuple[int, int]]:
        """Every (stage, replica) ``rank`` runs: one, or its chunks (interleaved)."""
        return self._of_rank[rank]

    def replicas(self, stage_idx: int) -> int:
        return self.plan.stages[stage_idx].replicas

    def rank_for(self, stage_idx: int, microbatch: int) -> int:
        """The rank of ``stage_idx`` that runs micro-batch ``microbatch``."""
        return self.rank_of(stage_idx, microbatch % self.replicas(stage_idx))

    def stage_ranks(self, stage_idx: int) -> list[int]:
        return [self.rank_of(stage_idx, replica) for replica in range(self.replicas(stage_idx))]

    def describe(self, rank: int) -> str:
        if self.plan.interleaved:
            chunks = ", ".join(str(stage) for stage, _ in self._of_rank[rank])
            return f"rank {rank} (stages {chunks})"
        stage_idx, replica = self._of_rank[rank][0]
        return f"rank {rank} (stage {stage_idx} replica {replica})"


def _stage_of_layers(
    plan: Plan, layer_names: Sequence[str], layer_index: Mapping[str, int]
) -> dict[str, int]:
    stage_of: dict[str, int] = {}
    for stage_idx, stage in enumerate(plan.stages):
        for name in stage.layers:
            if name not in layer_index:
                hint = (
                    "; a plan made from an operator-level profile runs with --granularity op"
                    if "." in name and all("." not in known for known in layer_names)
                    else ""
                )
                raise EngineError(
                    f"stage {stage_idx} names layer {name!r}, which the model "
                    f"does not have (its layers: {', '.join(layer_names)}){hint}"
                )
            if name in stage_of:
                raise EngineError(
                    f"layer {name!r} is in stage {stage_of[name]} and in stage {stage_idx}"
                )
            stage_of[name] = stage_idx
    if missing := [name for name in layer_names if name not in stage_of]:
        raise EngineError(f"layers {missing} of the model are in no stage of the plan")
    if unknown := sorted(set(plan.policies) - set(layer_index)):
        raise EngineError(
            f"the plan gives policies for layers {unknown}, which the model does not have"
        )
    return stage_of


def _check_flow(stage_of: Mapping[str, int], graph_inputs: Mapping[str, Sequence[str]]) -> None:
    for reader, sources in graph_inputs.items():
        for src in sources:
            if src != DATA and stage_of[src] > stage_of[reader]:
                raise EngineError(
                    f"layer {reader!r} in stage {stage_of[reader]} reads "
                    f"{src!r} from the later stage {stage_of[src]}: stages must "
                    "follow the data flow"
                )
