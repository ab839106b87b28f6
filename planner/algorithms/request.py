"""What a person asks the planners for, and what every planner answers.

A ``PlanRequest`` names the profile, the pipeline's shape (stages, micro-batches, schedule,
micro-batch size, optimizer) and the hardware (a cluster; or only a memory per device, in
which case links are free). A planner returns a ``PlannerOutput``: the plan and the value
of its own objective. ``run_planner`` times it and simulates the plan; when the planner
finds no plan that fits (``InfeasibleError``), it and ``call_planner`` find and name the
smallest device memory that would (``min_memory.py``).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pipestudio.planner.algorithms import schedules
from pipestudio.planner.algorithms.min_memory import explain_infeasible
from pipestudio.planner.cost_model.stage import (
    StageContext,
    link_time_ms,
    stage_contexts,
    stage_memory_bytes,
    stage_time_ms,
)
from pipestudio.planner.errors import InfeasibleError as InfeasibleError  # the planners' import
from pipestudio.planner.errors import PlanError, PlannerError, WorkBudgetError
from pipestudio.planner.formats.cluster import Cluster, cluster_template
from pipestudio.planner.formats.documents import MAX_MICROBATCH_SIZE, MAX_MICROBATCHES
from pipestudio.planner.formats.plan import (
    OPTIMIZER_STATE_FACTOR,
    PLANNED_SCHEDULES,
    SCHEDULES,
    Optimizer,
    Plan,
    Schedule,
    resolve_plan,
)
from pipestudio.planner.formats.profile import Profile
from pipestudio.planner.formats.result import SimResult
from pipestudio.planner.simulator.budget import StageWork, Workload, check_budget, most_boundaries
from pipestudio.planner.simulator.costs import StageCosts, boundary_bytes, layer_set_costs
from pipestudio.planner.simulator.simulate import simulate


@dataclass(frozen=True)
class PlanRequest:
    """The question every planner answers (see the module docstring)."""

    profile: Profile
    num_microbatches: int
    schedule: Schedule
    num_stages: int | None = None
    microbatch_size: int | None = None
    optimizer: Optimizer = "adam"
    cluster: Cluster | None = None
    #: every stage one replica (PipeDream's "straight pipeline"; ``--straight``)
    single_replica: bool = False

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise PlanError(
                f"schedule {self.schedule!r} is unknown; expected one of {', '.join(SCHEDULES)}"
            )
        if self.schedule not in PLANNED_SCHEDULES:
            raise PlanError(
                f"the planners plan {', '.join(PLANNED_SCHEDULES)}; make the {self.schedule} "
                "plan from a template (pipestudio plan-template) or by hand, and simulate it"
            )
        if self.optimizer not in OPTIMIZER_STATE_FACTOR:
            raise PlanError(
                f"optimizer {self.optimizer!r} is unknown; expected one of "
                f"{', '.join(OPTIMIZER_STATE_FACTOR)}"
            )
        if self.num_microbatches < 1:
            raise PlanError(f"--microbatches must be >= 1, got {self.num_microbatches}")
        if self.num_microbatches > MAX_MICROBATCHES:
            raise PlanError(
                f"--microbatches must be <= {MAX_MICROBATCHES} (a plan's limit), "
                f"got {self.num_microbatches}"
            )
        if self.microbatch_size is not None and self.microbatch_size < 1:
            raise PlanError(f"--microbatch-size must be >= 1, got {self.microbatch_size}")
        if self.microbatch_size is not None and self.microbatch_size > MAX_MICROBATCH_SIZE:
            raise PlanError(
                f"--microbatch-size must be <= {MAX_MICROBATCH_SIZE} (a plan's "
                f"limit), got {self.microbatch_size}"
            )
        if self.num_stages is not None:
            if not 1 <= self.num_stages <= self.profile.num_layers:
                raise PlanError(
                    f"--stages {self.num_stages} is not between 1 and the "
                    f"profile's {self.profile.num_layers} layers"
                )
            if self.cluster is not None and self.num_stages > self.cluster.num_devices:
                raise PlanError(
                    f"--stages {self.num_stages} needs {self.num_stages} devices "
                    f"but the cluster has {self.cluster.num_devices}"
                )

    @cached_property
    def scaled(self) -> Profile:
        """The profile at the requested micro-batch size."""
        return self.profile.rescaled(self.microbatch_size or self.profile.microbatch_size)

    @property
    def optimizer_factor(self) -> int:
        return OPTIMIZER_STATE_FACTOR[self.optimizer]

    def stages_required(self, algorithm: str) -> int:
        if self.num_stages is None:
            raise PlanError(f"algorithm {algorithm!r} needs --stages")
        return self.num_stages

    def contexts(self, replicas: list[int]) -> list[StageContext]:
        return stage_contexts(
            self.schedule, replicas, self.num_microbatches, self.optimizer, self.cluster
        )

    def build_plan(
        self,
        stages: list[list[int]],
        policies: dict[int, str] | None = None,
        *,
        replicas: list[int] | None = None,
        planner: str,
        settings: dict[str, Any] | None = None,
    ) -> Plan:
        """A Plan from layer indices per stage and non-keep policies by layer index."""
        names = [layer.name for layer in self.scaled.layers]
        replicas = replicas or [1] * len(stages)
        policies = policies or {}
        provenance: dict[str, Any] = {"planner": planner, **(settings or {})}
        return Plan.model_validate(
            {
                "model": self.profile.model,
                "schedule": self.schedule,
                "num_microbatches": self.num_microbatches,
                "microbatch_size": self.scaled.microbatch_size,
                "optimizer": self.optimizer,
                "precision": self.profile.precision,
                "stages": [
                    {"layers": [names[i] for i in layers], "replicas": count}
                    for layers, count in zip(stages, replicas, strict=True)
                ],
                "policies": {
                    names[i]: policies.get(i, "keep") for layers in stages for i in layers
                },
                "provenance": provenance,
            }
        )


@dataclass(frozen=True)
class PlanCost:
    """A plan under the planners' cost model: per-stage time and memory, the bottleneck."""

    stage_ms: list[float]
    link_ms: list[float]
    memory_bytes: list[int]
    fits: list[bool]

    @property
    def bottleneck_ms(self) -> float:
        return max(self.stage_ms + self.link_ms)


def plan_cost(request: PlanRequest, plan: Plan) -> PlanCost:
    """Evaluate a plan with the stage model (``cost_model/stage.py``).

    A link from stage a to stage c is costed between a's last device and c's first, as the
    ``optimal`` planner does (with devices in order: d0 - 1 and d0), and not divided among
    replicas.
    """
    profile = request.scaled
    layout = resolve_plan(plan, profile)
    contexts = request.contexts([stage.replicas for stage in plan.stages])
    devices = plan.worker_devices()
    costs: list[StageCosts] = [
        layer_set_costs(
            profile,
            indices,
            {i: plan.policy(profile.layers[i].name) for i in indices},
            request.optimizer_factor,
        )
        for indices in layout.stage_layers
    ]
    stage_ms = [stage_time_ms(c, ctx) for c, ctx in zip(costs, contexts, strict=True)]
    memory = [stage_memory_bytes(c, ctx) for c, ctx in zip(costs, contexts, strict=True)]
    fits = [
        ctx.memory_bytes is None or m <= ctx.memory_bytes
        for m, ctx in zip(memory, contexts, strict=True)
    ]
    link_ms = []
    for (src, dst), num_bytes in boundary_bytes(profile, layout).items():
        bandwidth = (
            None
            if request.cluster is None
            else request.cluster.bandwidth_gbps(devices[src][-1], devices[dst][0])
        )
        link_ms.append(link_time_ms(num_bytes, bandwidth))
    return PlanCost(stage_ms, link_ms, memory, fits)


@dataclass(frozen=True)
class PlannerOutput:
    plan: Plan
    objective_ms: float
    details: dict[str, Any] = field(default_factory=dict)


Planner = Callable[[PlanRequest], PlannerOutput]


@dataclass(frozen=True)
class PlanOutcome:
    """One planner's answer, timed and simulated (``compare`` prints a row of these)."""

    algorithm: str
    plan: Plan | None
    result: SimResult | None
    planner_ms: float
    objective_ms: float | None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    #: When no plan fits: the smallest memory per device at which one does (``min_memory.py``).
    min_memory_bytes: int | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "plan": None if self.plan is None else self.plan.model_dump(mode="json"),
            "result": None if self.result is None else self.result.model_dump(mode="json"),
            "planner_ms": self.planner_ms,
            "objective_ms": self.objective_ms,
            "error": self.error,
            "min_memory_bytes": self.min_memory_bytes,
        }


def call_planner(planner: Planner, request: PlanRequest) -> PlannerOutput:
    """``planner(request)``, except that when no plan fits, the InfeasibleError raised names
    the smallest device memory that would fit (``min_memory.explain_infeasible``)."""
    try:
        return planner(request)
    except InfeasibleError as exc:
        raise explain_infeasible(planner, request, exc) from exc


def check_request_budget(request: PlanRequest, max_ops: int | None, *, num_steps: int = 1) -> None:
    """Refuse ``request`` before any planner runs when simulating its plan for
    ``num_steps`` steps could build more than ``max_ops`` ops (``simulator/budget.py``; ``None``: no
    limit), with ``WorkBudgetError``.

    The plan is not known yet, so the count is an upper bound over the plans a planner may
    return: the most workers the request allows (``num_stages``, or every device of the
    cluster, which ``pipedream`` uses) in as many stages as there are layers for, every
    stage recomputing and swapping, and the most pairs of stages that exchange tensors.
    """
    if max_ops is None:
        return
    cluster_devices = 0 if request.cluster is None else request.cluster.num_devices
    num_workers = max(request.num_stages or 1, cluster_devices)
    by_cluster = cluster_devices > (request.num_stages or 0)
    workers_field = "cluster.devices" if by_cluster else "num_stages"
    _check_search(request, num_workers, workers_field)  # cheap: before any bound is built
    num_stages = min(num_workers, request.profile.num_layers)
    base, extra = divmod(num_workers, num_stages)
    stages = tuple(
        StageWork(base + (idx < extra), recomputes=True, swaps=True, updates=True)
        for idx in range(num_stages)
    )
    workload = Workload(
        request.schedule,
        num_steps,
        request.num_microbatches,
        stages,
        most_boundaries(request.profile, num_stages),
    )
    check_budget(
        workload,
        max_ops,
        fields={"num_microbatches": request.num_microbatches, workers_field: num_workers},
    )


#: The planners' own search, which the simulation budget does not see: with at most this
#: many workers and layers x workers, each planner answers within about a second on a
#: 2-core machine (the slowest, pipedream and vpipe, grow with the workers squared or
#: faster: 8 s and 3.5 s for 7,800 layers on 128 workers; at 64 workers and 15,600
#: layers, 1.0 and 0.9 s; optimal 0.9 s).
MAX_PLANNED_WORKERS = 64
MAX_PLANNED_CELLS = 1_000_000


def _check_search(request: PlanRequest, num_workers: int, field: str) -> None:
    cells = num_workers * request.profile.num_layers
    if num_workers > MAX_PLANNED_WORKERS:
        raise WorkBudgetError(
            f"{field}={num_workers}: a planner may be asked to place layers on at most "
            f"{MAX_PLANNED_WORKERS} workers here; plan with fewer, or with `pipestudio "
            "plan`, which has no work budget",
            field=field,
            limit=MAX_PLANNED_WORKERS,
            num_ops=num_workers,
        )
    if cells > MAX_PLANNED_CELLS:
        raise WorkBudgetError(
            f"{field}={num_workers}: planning {request.profile.num_layers} layers onto "
            f"{num_workers} workers weighs {cells} layer-worker pairs, more than the limit "
            f"of {MAX_PLANNED_CELLS}; plan with fewer workers, or with `pipestudio plan`",
            field=field,
            limit=MAX_PLANNED_CELLS,
            num_ops=cells,
        )


def run_planner(
    algorithm: str,
    planner: Planner,
    request: PlanRequest,
    *,
    with_timeline: bool = True,
    max_ops: int | None = None,
    auto: bool = False,
) -> PlanOutcome:
    """Run one planner, time it, simulate its plan; a planner error becomes ``error``.

    ``planner_ms`` is the one call that answered ``request``; when it found no plan that
    fits, the search for the smallest memory that does comes after and is not counted.
    With ``max_ops``, a request whose simulation could build more ops is refused first
    (``check_request_budget``), raising ``WorkBudgetError``. With ``auto`` the schedule is
    chosen (``_run_auto``).
    """
    check_request_budget(request, max_ops)
    if auto:
        return _run_auto(algorithm, planner, request, with_timeline)
    started = time.perf_counter()
    try:
        output = planner(request)
    except PlannerError as exc:
        elapsed = (time.perf_counter() - started) * 1e3
        if isinstance(exc, InfeasibleError):
            exc = explain_infeasible(planner, request, exc)
            return PlanOutcome(
                algorithm,
                None,
                None,
                elapsed,
                None,
                str(exc),
                min_memory_bytes=exc.min_memory_bytes,
            )
        return PlanOutcome(algorithm, None, None, elapsed, None, str(exc))
    elapsed = (time.perf_counter() - started) * 1e3
    result = simulate(request.scaled, output.plan, request.cluster, with_timeline=with_timeline)
    return PlanOutcome(
        algorithm, output.plan, result, elapsed, output.objective_ms, None, output.details
    )


def _run_auto(
    algorithm: str, planner: Planner, request: PlanRequest, with_timeline: bool
) -> PlanOutcome:
    """``run_planner`` with the schedule chosen (``schedules.py``): the fastest fitting
    of the planner's plans for each synchronous schedule; the plan's provenance lists
    every candidate's simulated step."""
    candidates, elapsed = schedules.timed(planner, request, memory_only_cluster)
    rows = schedules.summary(candidates)
    chosen = schedules.best(candidates)
    if chosen is None or chosen.plan is None:
        listed = "; ".join(f"{label.removeprefix('auto ')}: {text}" for label, text in rows.items())
        return PlanOutcome(algorithm, None, None, elapsed, None, f"no schedule fits ({listed})")
    plan = chosen.plan.model_copy(
        update={"provenance": {**chosen.plan.provenance, "schedule_chosen_by": "auto", **rows}}
    )
    result = simulate(request.scaled, plan, request.cluster, with_timeline=with_timeline)
    return PlanOutcome(
        algorithm, plan, result, elapsed, result.step_time_ms, None, {"schedules": rows}
    )


def memory_only_cluster(
    num_devices: int, device_memory_bytes: int | None, host_bandwidth_gbps: float | None = None
) -> Cluster:
    """A cluster of ``num_devices`` with free links between them (``--device-memory``)."""
    return cluster_template(
        [num_devices],
        [None],
        device_memory_bytes=device_memory_bytes,
        host_bandwidth_gbps=host_bandwidth_gbps,
        name="memory-only",
    )
