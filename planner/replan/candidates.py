"""The repartitions the online planner weighs: the optimum, and refinements of the current one.

Three candidates, all keeping the plan's schedule, micro-batching, optimizer, stages,
replicas and devices:

``optimal``        the exact planner (``planners/optimal.py``) on the observed profile with the
                   same number of stages, one replica each; it may move many layers and change
                   memory policies. Straight plans only. Its cost model places stage s on
                   device s; a plan placed otherwise keeps its devices, and the simulation that
                   judges every candidate (``online.py``) sees the real links.
``relieve``        vPipe's repartition from the CURRENT cut points (Zhao et al., TPDS'22,
                   §4): boundary layers leave the slowest stage while the pipeline improves.
                   Few moves, so a cheap migration.
``kernighan-lin``  ``relieve`` followed by vPipe's Kernighan-Lin passes over the cut points,
                   which escape the local minimum at the price of more moves.

The refinements need the current stages as cut points of the profile's layer order: a
chain's stages always are, and a graph's are when the plan cuts its topological order, as
every planner does (``cost_model/coarsen.py``: the search then runs on the backbone). They score cut
points with ``PartitionCosts`` placed on the plan's own replicas and devices
(``PlacedPartitionCosts``). Every stage keeps the policies its layers had unless the memory
optimizer's choice fits where they do not, or is faster, so a move changes few policies.
"""

from collections.abc import Mapping
from dataclasses import dataclass, replace

from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms.request import PlanRequest
from pipestudio.planner.algorithms.vpipe import kernighan_lin, relieve_bottleneck
from pipestudio.planner.cost_model.chain import StageEvaluator
from pipestudio.planner.cost_model.coarsen import backbone
from pipestudio.planner.cost_model.memopt.greedy import solve_greedy
from pipestudio.planner.cost_model.partition import PartitionCosts
from pipestudio.planner.cost_model.stage import (
    StageContext,
    link_time_ms,
    stage_contexts,
    stage_memory_bytes,
    stage_time_ms,
)
from pipestudio.planner.errors import PlannerError
from pipestudio.planner.formats.cluster import Cluster
from pipestudio.planner.formats.plan import Plan, resolve_plan
from pipestudio.planner.formats.profile import Profile
from pipestudio.planner.simulator.costs import layer_set_costs

Bounds = list[int]
REFINEMENTS = ("relieve", "kernighan-lin")


@dataclass(frozen=True)
class Candidate:
    """A candidate plan by name, or why there is none (``note``)."""

    name: str
    plan: Plan | None
    note: str = ""


def plan_request(plan: Plan, profile: Profile, cluster: Cluster | None) -> PlanRequest:
    """The question the planners answer for ``plan``'s shape on the observed profile. The
    number of stages is left out: plans may share devices between stages, which a request
    for K stages refuses on fewer than K devices; ``optimal_candidate`` asks for it."""
    return PlanRequest(
        profile=profile,
        num_microbatches=plan.num_microbatches,
        schedule=plan.schedule,
        microbatch_size=plan.microbatch_size,
        optimizer=plan.optimizer,
        cluster=cluster,
        single_replica=True,
    )


class PlacedPartitionCosts(PartitionCosts):
    """``PartitionCosts`` on the plan's own replicas and devices instead of one replica per
    stage on devices 0..K-1: stage contexts from the plan (memory, host links, replicas and
    their all-reduce, which ``StageEvaluator`` turns into the stage model's time) and links
    from a stage's last replica's device to the next stage's first, as ``request.plan_cost``
    counts them."""

    def __init__(self, request: PlanRequest, plan: Plan) -> None:
        # The base class places stage s on device s; its contexts and links are replaced.
        super().__init__(replace(request, cluster=None), plan.num_stages, solve_greedy)
        devices = plan.worker_devices()
        self.contexts = stage_contexts(
            plan.schedule,
            [s.replicas for s in plan.stages],
            plan.num_microbatches,
            plan.optimizer,
            request.cluster,
            devices,
        )
        self.evaluator = StageEvaluator(self.chain, self.contexts)
        cluster, outputs = request.cluster, self.chain.layer_output
        self.links = [[0.0] * (self.num_layers + 1)]
        for s in range(1, plan.num_stages):
            bandwidth = (
                None
                if cluster is None
                else cluster.bandwidth_gbps(devices[s - 1][-1], devices[s][0])
            )
            self.links.append([0.0] + [link_time_ms(out, bandwidth) for out in outputs])


def cut_points(plan: Plan, profile: Profile) -> Bounds | None:
    """The plan's stages as cut points of the profile's layer order, or None when a stage is
    not a contiguous run of it."""
    layout = resolve_plan(plan, profile)
    bounds = [0]
    for indices in layout.stage_layers:
        if indices[0] != bounds[-1] or indices[-1] - indices[0] + 1 != len(indices):
            return None
        bounds.append(indices[-1] + 1)
    return bounds


def refinements(plan: Plan, request: PlanRequest) -> list[Candidate]:
    """``relieve`` and ``kernighan-lin`` from the current cut points (module docstring)."""
    profile = request.scaled
    bounds = cut_points(plan, profile)
    if bounds is None:
        note = "the current stages are not contiguous runs of the profile's layer order"
        return [Candidate(name, None, note) for name in REFINEMENTS]
    chain = backbone(profile)
    costs = PlacedPartitionCosts(
        replace(request, profile=chain, microbatch_size=chain.microbatch_size), plan
    )
    relieved, _ = relieve_bottleneck(costs, bounds, 1)
    refined, _ = kernighan_lin(costs, relieved, 1)
    return [
        Candidate(name, _refined_plan(plan, request, costs, found, name))
        for name, found in zip(REFINEMENTS, (relieved, refined), strict=True)
    ]


def _refined_plan(
    plan: Plan, request: PlanRequest, costs: PlacedPartitionCosts, bounds: Bounds, name: str
) -> Plan:
    profile = request.scaled
    greedy = costs.policies(bounds)
    policies: dict[str, str] = {}
    stages = costs.stages(bounds)
    for s, indices in enumerate(stages):
        carried = {i: plan.policy(profile.layers[i].name) for i in indices}
        chosen = {i: greedy.get(i, "keep") for i in indices}
        best = _faster_policies(request, costs.contexts[s], indices, carried, chosen)
        policies.update({profile.layers[i].name: p for i, p in best.items()})
    names = [[profile.layers[i].name for i in indices] for indices in stages]
    return rebuild(plan, names, policies, name)


def _faster_policies(
    request: PlanRequest,
    ctx: StageContext,
    indices: list[int],
    carried: dict[int, str],
    chosen: dict[int, str],
) -> dict[int, str]:
    """``carried`` unless ``chosen`` fits where it does not, or is faster while both fit."""

    def rank(policy: dict[int, str]) -> tuple[bool, float]:
        costs = layer_set_costs(request.scaled, indices, policy, request.optimizer_factor)
        fits = ctx.memory_bytes is None or stage_memory_bytes(costs, ctx) <= ctx.memory_bytes
        return not fits, stage_time_ms(costs, ctx)

    return chosen if rank(chosen) < rank(carried) else carried


def optimal_candidate(plan: Plan, request: PlanRequest) -> Candidate:
    """The exact planner's plan for the observed profile, placed on the plan's devices."""
    try:
        output = PLANNERS["optimal"](replace(request, num_stages=plan.num_stages))
    except PlannerError as exc:
        return Candidate("optimal", None, str(exc))
    names = [stage.layers for stage in output.plan.stages]
    return Candidate("optimal", rebuild(plan, names, output.plan.policies, "optimal"))


def rebuild(
    plan: Plan, stage_layers: list[list[str]], policies: Mapping[str, str], candidate: str
) -> Plan:
    """``plan`` with other layers per stage and other policies, all else kept."""
    stages = [
        stage.model_copy(update={"layers": layers})
        for stage, layers in zip(plan.stages, stage_layers, strict=True)
    ]
    origin = plan.provenance.get("replanned_from", plan.provenance.get("planner"))
    provenance = {
        **plan.provenance,
        "planner": "replan",
        "candidate": candidate,
        "replanned_from": origin,
    }
    return Plan.model_validate(
        {
            **plan.model_dump(),
            "stages": [s.model_dump() for s in stages],
            "policies": dict(policies),
            "provenance": provenance,
        }
    )
