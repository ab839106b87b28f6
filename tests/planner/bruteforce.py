"""Exhaustive search over every replication, partition and memory policy of a chain, scored
with the stage model, and over every replication and partition, simulated: the oracles the
``optimal`` planner must equal.

A plan on D devices is a composition of D into replica counts (each dividing the
micro-batches; only ones when the request is straight), one stage per part on consecutive
devices, a partition of the layers into that many stages, and a policy per layer. Each
stage is scored with ``stage_model.stage_time_ms`` and ``stage_memory_bytes`` in the
context ``stage_model.stage_context`` gives its first device and replicas, and each link
between device d0 - 1 and d0 with ``link_time_ms``.

The policy enumeration prunes only what cannot matter, by monotonicity: with the layers
not yet assigned left out, a partial assignment's memory and time are at most those of any
way to finish it (every term of either is a sum over assigned layers, and the stage time
only grows with recompute time and swapped bytes), and so is its swap-out time.
"""

import itertools
import math
from collections.abc import Iterator
from dataclasses import replace

from pipestudio.planner.algorithms.optimal.program import DeviceLayout
from pipestudio.planner.algorithms.optimal.refine import (
    Candidate,
    PlannedStage,
    StageChoices,
    build,
)
from pipestudio.planner.algorithms.request import PlanRequest
from pipestudio.planner.cost_model.chain import ChainCosts, StageEvaluator
from pipestudio.planner.cost_model.stage import (
    StageContext,
    link_time_ms,
    stage_context,
    stage_memory_bytes,
    stage_time_ms,
    swap_times_ms,
)
from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.simulator.costs import StageCosts, layer_set_costs
from pipestudio.planner.simulator.simulate import simulate


def replica_counts(request: PlanRequest) -> list[int]:
    num_devices = request.num_stages or 1
    if request.single_replica:
        return [1]
    return [r for r in range(1, num_devices + 1) if request.num_microbatches % r == 0]


def compositions(total: int, parts: list[int]) -> Iterator[tuple[int, ...]]:
    """Every sequence of ``parts`` (repeats allowed) that adds up to ``total``."""
    if total == 0:
        yield ()
        return
    for part in parts:
        if part <= total:
            for rest in compositions(total - part, parts):
                yield (part, *rest)


def context(request: PlanRequest, first_device: int, replicas: int) -> StageContext:
    return stage_context(
        request.schedule,
        request.num_microbatches,
        request.optimizer,
        request.cluster,
        first_worker=first_device,
        replicas=replicas,
        num_workers=request.num_stages or 1,
    )


def best_stage_ms(request: PlanRequest, start: int, end: int, ctx: StageContext) -> float:
    """The fastest policy assignment of layers start..end-1 in context ``ctx`` that fits;
    inf when none does. Keeping every layer is fastest when it fits (no choice computes less
    than F + B); otherwise every assignment is tried, but for the pruning of the module
    docstring."""
    profile = request.scaled
    indices = list(range(start, end))
    whole = layer_set_costs(
        profile, indices, dict.fromkeys(indices, "keep"), request.optimizer_factor
    )
    if ctx.memory_bytes is None or stage_memory_bytes(whole, ctx) <= ctx.memory_bytes:
        return stage_time_ms(whole, ctx)
    layers = profile.layers
    inputs = [profile.input_bytes if i == 0 else layers[i - 1].output_bytes for i in indices]
    none = replace(whole, keep_bytes=0)
    best = math.inf

    def hopeless(costs: StageCosts) -> bool:
        out_ms, _ = swap_times_ms(costs.swap_bytes, ctx)
        return (
            stage_memory_bytes(costs, ctx) > ctx.memory_bytes  # type: ignore[operator]
            or out_ms > min(costs.fwd_ms, costs.bwd_ms)  # memopt.py's swap limit
            or stage_time_ms(costs, ctx) >= best
        )

    def visit(pos: int, costs: StageCosts, last_recompute: bool) -> None:
        nonlocal best
        if hopeless(costs):
            return
        if pos == len(indices):
            best = stage_time_ms(costs, ctx)
            return
        layer = layers[indices[pos]]
        saved = layer.saved_bytes
        visit(pos + 1, replace(costs, keep_bytes=costs.keep_bytes + saved), False)
        visit(pos + 1, replace(costs, swap_bytes=costs.swap_bytes + saved), False)
        checkpoint = 0 if last_recompute else inputs[pos]
        visit(
            pos + 1,
            replace(
                costs,
                recompute_bytes=costs.recompute_bytes + saved,
                checkpoint_bytes=costs.checkpoint_bytes + checkpoint,
                recompute_ms=costs.recompute_ms + layer.fwd_ms,
            ),
            True,
        )

    visit(0, none, False)
    return best


def brute_force_bottleneck(request: PlanRequest) -> float:
    """The smallest bottleneck over every plan of the module docstring (inf: none fits)."""
    profile = request.scaled
    num_layers, num_devices = profile.num_layers, request.num_stages or 1
    cluster = request.cluster
    memo: dict[tuple[int, int, int, int], float] = {}
    best = math.inf
    for replicas in compositions(num_devices, replica_counts(request)):
        firsts = [0, *itertools.accumulate(replicas)][:-1]
        for cuts in itertools.combinations(range(1, num_layers), len(replicas) - 1):
            bounds = [0, *cuts, num_layers]
            value = 0.0
            for (start, end), first, count in zip(
                itertools.pairwise(bounds), firsts, replicas, strict=True
            ):
                key = (start, end, first, count)
                if key not in memo:
                    memo[key] = best_stage_ms(request, start, end, context(request, first, count))
                value = max(value, memo[key])
                if first > 0:
                    bandwidth = (
                        None if cluster is None else cluster.bandwidth_gbps(first - 1, first)
                    )
                    value = max(
                        value, link_time_ms(profile.layers[start - 1].output_bytes, bandwidth)
                    )
            best = min(best, value)
    return best


def candidate_plans(request: PlanRequest) -> Iterator[Plan]:
    """Every plan ``optimal``'s second phase chooses from (``optimal_refine``): each
    replication and partition of the module docstring, each stage with its fastest fitting
    choice (``StageChoices``, which ``brute_force_bottleneck`` checks on the same stages);
    plans with a stage that cannot fit are left out."""
    chain = ChainCosts.of(request)
    layout = DeviceLayout.of(request, request.num_stages or 1)
    choices = StageChoices(StageEvaluator(chain, layout.contexts))
    for replicas in compositions(layout.num_devices, list(layout.replica_counts)):
        firsts = [0, *itertools.accumulate(replicas)][:-1]
        for cuts in itertools.combinations(range(1, chain.num_layers), len(replicas) - 1):
            stages = [
                PlannedStage(start, end, first, count)
                for (start, end), first, count in zip(
                    itertools.pairwise([0, *cuts, chain.num_layers]), firsts, replicas, strict=True
                )
            ]
            chosen = [
                choice
                for s in stages
                if (
                    choice := choices.get(
                        s.start, s.end, layout.context(s.first_device, s.replicas)
                    )
                )
                is not None
            ]
            if len(chosen) == len(stages):
                yield build(request, Candidate(stages, chosen))


def brute_force_step(request: PlanRequest) -> tuple[float, int]:
    """The fastest simulated step over ``candidate_plans`` whose plan fits as simulated
    (inf: none does), and how many plans were simulated."""
    best, count = math.inf, 0
    for plan in candidate_plans(request):
        count += 1
        result = simulate(request.scaled, plan, request.cluster, with_timeline=False)
        if result.fits:
            best = min(best, result.step_time_ms)
    return best, count


def every_straight_plan(request: PlanRequest) -> Iterator[Plan]:
    """Every plan of one stage per device: each partition of the layers into as many stages
    as there are devices times each keep/recompute/swap policy of every layer (3^n), with no
    pruning at all."""
    num_layers, num_devices = request.scaled.num_layers, request.num_stages or 1
    for cuts in itertools.combinations(range(1, num_layers), num_devices - 1):
        bounds = [0, *cuts, num_layers]
        stages = [list(range(start, end)) for start, end in itertools.pairwise(bounds)]
        for policies in itertools.product(("keep", "recompute", "swap"), repeat=num_layers):
            chosen = {layer: p for layer, p in enumerate(policies) if p != "keep"}
            yield request.build_plan(
                stages, chosen, replicas=[1] * num_devices, planner="bruteforce"
            )


def simulate_every_straight_plan(request: PlanRequest) -> list[tuple[float, int]]:
    """(simulated step, largest peak of any stage) of every plan of ``every_straight_plan``.
    The cluster's memory only decides whether a plan fits, so one pass answers every cap:
    the fastest plan that fits in M is the fastest whose peak is at most M."""
    scored = []
    for plan in every_straight_plan(request):
        result = simulate(request.scaled, plan, request.cluster, with_timeline=False)
        scored.append((result.step_time_ms, max(stage.peak_bytes for stage in result.stages)))
    return scored
