"""Exhaustive search over every partition of a chain and every policy of every layer,
scored with the stage model: the oracle the ``optimal`` planner must equal."""

import itertools
import math
from dataclasses import replace

from pipestudio.planner.costs import layer_set_costs
from pipestudio.planner.request import PlanRequest
from pipestudio.planner.stage_model import (
    link_time_ms,
    stage_memory_bytes,
    stage_time_ms,
    swap_times_ms,
)


def best_stage_ms(request: PlanRequest, start: int, end: int, position: int) -> float:
    """The fastest policy assignment of layers start..end-1 as stage ``position`` that fits;
    inf when none does. Without a memory limit keeping every layer is fastest.

    Every one of the 3^n assignments is scored: sums are carried down the enumeration, and
    each complete assignment becomes a StageCosts scored by the stage model."""
    profile = request.scaled
    ctx = request.contexts([1] * (request.num_stages or 1))[position]
    indices = list(range(start, end))
    whole = layer_set_costs(profile, indices, dict.fromkeys(indices, "keep"),
                            request.optimizer_factor)
    if ctx.memory_bytes is None:
        return stage_time_ms(whole, ctx)
    layers = profile.layers
    inputs = [profile.input_bytes if i == 0 else layers[i - 1].output_bytes for i in indices]
    best = math.inf

    def visit(pos: int, keep: int, swap: int, recompute: int, checkpoint: int,
              recompute_ms: float, last_recompute: bool) -> None:
        nonlocal best
        if pos == len(indices):
            costs = replace(whole, keep_bytes=keep, swap_bytes=swap, recompute_bytes=recompute,
                            checkpoint_bytes=checkpoint, recompute_ms=recompute_ms)
            if stage_memory_bytes(costs, ctx) > ctx.memory_bytes:  # type: ignore[operator]
                return
            out_ms, _ = swap_times_ms(swap, ctx)
            if out_ms > min(costs.fwd_ms, costs.bwd_ms):
                return  # the memory optimizers' swap limit (memopt.py)
            best = min(best, stage_time_ms(costs, ctx))
            return
        layer = layers[indices[pos]]
        saved = layer.saved_bytes
        visit(pos + 1, keep + saved, swap, recompute, checkpoint, recompute_ms, False)
        visit(pos + 1, keep, swap + saved, recompute, checkpoint, recompute_ms, False)
        visit(pos + 1, keep, swap, recompute + saved,
              checkpoint + (0 if last_recompute else inputs[pos]),
              recompute_ms + layer.fwd_ms, True)

    visit(0, 0, 0, 0, 0, 0.0, False)
    return best


def brute_force_bottleneck(request: PlanRequest) -> float:
    profile = request.scaled
    num_layers, num_stages = profile.num_layers, request.num_stages or 1
    cluster = request.cluster
    memo: dict[tuple[int, int, int], float] = {}
    best = math.inf
    for cuts in itertools.combinations(range(1, num_layers), num_stages - 1):
        bounds = [0, *cuts, num_layers]
        value = 0.0
        for position, (start, end) in enumerate(itertools.pairwise(bounds)):
            key = (start, end, position)
            if key not in memo:
                memo[key] = best_stage_ms(request, start, end, position)
            value = max(value, memo[key])
            if position > 0:
                bandwidth = None if cluster is None else cluster.bandwidth_gbps(position - 1,
                                                                               position)
                value = max(value, link_time_ms(profile.layers[start - 1].output_bytes,
                                                bandwidth))
        best = min(best, value)
    return best
