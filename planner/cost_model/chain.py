"""A chain profile under the stage model: O(1) interval sums and each stage's subproblem.

Every chain planner asks the same question of a candidate stage, layers i..j-1 in context s
(its position, replicas and devices: a ``stage_model.StageContext``): what does it cost
(``stage.py``) and, when it does not fit its device, which keep/recompute/swap choice
should it make (``memopt/exact.py``)? ``ChainCosts`` holds the prefix sums that answer
sums over i..j-1 in O(1); ``StageEvaluator`` turns a candidate into a ``memopt.StageProblem`` (one
replica's compute), settles the easy cases in O(1) (``bounds``), solves the rest with the
memory optimizer a planner names, and answers in stage time, replicas, update and
all-reduce included, as ``stage_model.stage_time_ms`` does.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

from pipestudio.planner.algorithms.request import PlanRequest
from pipestudio.planner.cost_model.memopt.exact import KEEP, StageChoice, StageProblem
from pipestudio.planner.cost_model.rangemax import RangeMax
from pipestudio.planner.cost_model.stage import StageContext, link_time_ms

#: A memory optimizer: the problem of one stage -> its choice, or None when nothing fits.
Solver = Callable[[StageProblem], StageChoice | None]


@dataclass
class ChainCosts:
    """Prefix sums and per-layer values of a chain, for O(1) interval sums."""

    fwd: list[float]
    bwd: list[float]
    update: list[float]
    params: list[int]
    saved: list[int]
    layer_fwd: list[float]
    layer_bwd: list[float]
    layer_saved: list[int]
    layer_input: list[int]
    layer_output: list[int]
    workspace: RangeMax
    largest_saved: RangeMax
    best_ratio: RangeMax
    layer_worth: list[float]  # saved bytes per forward ms (inf for a free forward)

    @classmethod
    def of(cls, request: PlanRequest) -> "ChainCosts":
        layers = request.scaled.layers
        fwd, bwd, update, params, saved = [0.0], [0.0], [0.0], [0], [0]
        for layer in layers:
            fwd.append(fwd[-1] + layer.fwd_ms)
            bwd.append(bwd[-1] + layer.bwd_ms)
            update.append(update[-1] + layer.update_ms)
            params.append(params[-1] + layer.param_bytes)
            saved.append(saved[-1] + layer.saved_bytes)
        outputs = [layer.output_bytes for layer in layers]
        ratios = [
            layer.saved_bytes / layer.fwd_ms if layer.fwd_ms > 0 else math.inf for layer in layers
        ]
        return cls(
            fwd,
            bwd,
            update,
            params,
            saved,
            [layer.fwd_ms for layer in layers],
            [layer.bwd_ms for layer in layers],
            [layer.saved_bytes for layer in layers],
            [request.scaled.input_bytes, *outputs[:-1]],
            outputs,
            RangeMax([layer.workspace_bytes for layer in layers]),
            RangeMax([layer.saved_bytes for layer in layers]),
            RangeMax(ratios),
            ratios,
        )

    @property
    def num_layers(self) -> int:
        return len(self.layer_fwd)

    def base_ms(self, i: int, j: int) -> float:
        """Forward plus backward time of layers i..j-1."""
        return self.fwd[j] - self.fwd[i] + self.bwd[j] - self.bwd[i]

    def layer_times(self) -> list[float]:
        return [f + b for f, b in zip(self.layer_fwd, self.layer_bwd, strict=True)]


class StageEvaluator:
    """stage(i, j, s): the time per micro-batch of layers i..j-1 in context s (its position,
    replicas and devices), with the keep/recompute/swap choice that fits its device
    (``math.inf`` when none does).

    The memory subproblem (``memopt``) is one replica's: its time is the replica's compute
    per micro-batch, C = max(F + B + R + stall, swap-out, swap-in) in ``stage_model``'s terms.
    ``stage_ms`` turns that into the stage model's time
    (``stage_model.stage_time_ms``): compute / r plus ``extra_ms``, the stage's share of its
    update and all-reduce; ``compute_ms`` is the inverse, for cutoffs and floors.
    """

    def __init__(self, chain: ChainCosts, contexts: list[StageContext]) -> None:
        self.chain, self.contexts = chain, contexts
        self.proven = True
        self.solved = 0

    def extra_ms(self, i: int, j: int, s: int) -> float:
        """Update and all-reduce per micro-batch of the pipeline: each replica updates after
        every micro-batch for pipedream (so r of them share that), else once per step."""
        chain, ctx = self.chain, self.contexts[s]
        total = chain.update[j] - chain.update[i]
        if ctx.allreduce_ms_per_param_byte:
            total += ctx.allreduce_ms_per_param_byte * (chain.params[j] - chain.params[i])
        if ctx.schedule == "pipedream":
            return total / ctx.replicas
        return total / ctx.num_microbatches

    def stage_ms(self, compute_ms: float, i: int, j: int, s: int) -> float:
        """The stage model's time of a stage whose replica computes ``compute_ms``."""
        return compute_ms / self.contexts[s].replicas + self.extra_ms(i, j, s)

    def least_ms(self, i: int, j: int, s: int) -> float:
        """The stage's time when it keeps every layer: no choice is faster, and it only
        grows as the stage takes more layers (every term of it is a sum over them)."""
        return self.stage_ms(self.chain.base_ms(i, j), i, j, s)

    def compute_ms(self, stage_ms: float, i: int, j: int, s: int) -> float:
        """The replica compute time at which the stage takes ``stage_ms``."""
        return (stage_ms - self.extra_ms(i, j, s)) * self.contexts[s].replicas

    def keep_all_bytes(self, i: int, j: int, s: int) -> float:
        """Peak memory of the stage when it keeps every layer."""
        chain, ctx = self.chain, self.contexts[s]
        params = chain.params[j] - chain.params[i]
        static = params * (2 + ctx.optimizer_factor + ctx.weight_versions - 1)
        return static + chain.workspace(i, j) + ctx.inflight * (chain.saved[j] - chain.saved[i])

    def floor_bytes(self, i: int, j: int, s: int) -> float:
        """Peak memory no choice of the stage goes below: its static bytes, workspace and
        every layer's saved bytes once (kept k x, swapped c x, recomputed once; checkpoints
        only add). It grows as the stage takes more layers."""
        chain, ctx = self.chain, self.contexts[s]
        return self.keep_all_bytes(i, j, s) - (ctx.inflight - 1) * (chain.saved[j] - chain.saved[i])

    def context_key(self, s: int) -> tuple[object, ...]:
        """What problem(i, j, s) depends on besides i and j: contexts with equal keys (all of
        GPipe's stages with as many replicas, say) pose the same problem for the same layers."""
        ctx = self.contexts[s]
        mode = "gpipe" if ctx.schedule == "gpipe" else ("last" if ctx.warmup == 0 else "warm")
        return (
            ctx.inflight,
            ctx.swap_buffers,
            ctx.weight_versions,
            ctx.memory_bytes,
            mode,
            ctx.host_in_bytes_per_ms,
            ctx.host_out_bytes_per_ms,
        )

    def problem(self, i: int, j: int, s: int) -> StageProblem:
        chain, ctx = self.chain, self.contexts[s]
        keep_all = int(self.keep_all_bytes(i, j, s))
        need = keep_all - ctx.memory_bytes if ctx.memory_bytes is not None else -1
        mode = "gpipe" if ctx.schedule == "gpipe" else ("last" if ctx.warmup == 0 else "warm")
        return StageProblem(
            fwd_ms=tuple(chain.layer_fwd[i:j]),
            saved_bytes=tuple(chain.layer_saved[i:j]),
            input_bytes=tuple(chain.layer_input[i:j]),
            forward_ms=chain.fwd[j] - chain.fwd[i],
            backward_ms=chain.bwd[j] - chain.bwd[i],
            inflight=ctx.inflight,
            swap_buffers=ctx.swap_buffers,
            need_bytes=need,
            swap_mode=mode,
            host_in_bytes_per_ms=ctx.host_in_bytes_per_ms,
            host_out_bytes_per_ms=ctx.host_out_bytes_per_ms,
            worth=tuple(chain.layer_worth[i:j]),
        )

    def bounds(self, i: int, j: int, s: int) -> tuple[float, bool]:
        """(lower bound on stage(i, j, s), whether it is the exact value); inf when nothing
        can fit."""
        low, settled = self.compute_bounds(i, j, s)
        return (low if math.isinf(low) else self.stage_ms(low, i, j, s)), settled

    def compute_bounds(self, i: int, j: int, s: int) -> tuple[float, bool]:
        """``bounds`` in replica compute time (C in ``stage_model``)."""
        chain, ctx = self.chain, self.contexts[s]
        base = chain.base_ms(i, j)
        if ctx.memory_bytes is None:
            return base, True
        need = self.keep_all_bytes(i, j, s) - ctx.memory_bytes
        if need <= 0:
            return base, True
        saved = chain.saved[j] - chain.saved[i]
        k, c = ctx.inflight, ctx.swap_buffers
        if k <= 1 or need > (k - 1) * saved:  # the floor (``floor_bytes``) does not fit
            return math.inf, True
        fwd, bwd = chain.fwd[j] - chain.fwd[i], chain.bwd[j] - chain.bwd[i]
        free_swap = _free_swap_bytes(fwd, bwd, ctx)
        per_byte = k - c
        if per_byte > 0:
            lo = math.ceil(need / per_byte)
            if lo <= saved and free_swap - lo >= chain.largest_saved(i, j):
                return base, True  # layers in order overshoot lo by less than one layer
        rest = need - max(per_byte, 0) * min(free_swap, saved)
        if rest <= 0:
            return base, False  # swap alone may do it, if some layers' sizes add up
        # Each ms more frees at most (k-1) x the best saved bytes per forward ms by recompute
        # plus (k-c) x the faster host link's bytes per ms by swap.
        rates = [ctx.host_in_bytes_per_ms, ctx.host_out_bytes_per_ms]
        swap_rate = (
            0.0
            if per_byte <= 0
            else per_byte * max(math.inf if rate is None else rate for rate in rates)
        )
        return base + rest / ((k - 1) * chain.best_ratio(i, j) + swap_rate), False

    def solve(self, i: int, j: int, s: int, solver: Solver) -> tuple[float, StageChoice | None]:
        """stage(i, j, s) with ``solver`` choosing the policies; (inf, None) if none fits."""
        ctx = self.contexts[s]
        if ctx.memory_bytes is None or self.keep_all_bytes(i, j, s) <= ctx.memory_bytes:
            base = self.chain.base_ms(i, j)
            return self.stage_ms(base, i, j, s), StageChoice(base, (KEEP,) * (j - i), True)
        low, _ = self.compute_bounds(i, j, s)
        if math.isinf(low):
            return low, None
        self.solved += 1
        choice = solver(self.problem(i, j, s))
        if choice is None:
            return math.inf, None
        self.proven = self.proven and choice.exact
        return self.stage_ms(choice.time_ms, i, j, s), choice


def _free_swap_bytes(fwd: float, bwd: float, ctx: StageContext) -> float:
    """Swap that costs no time: within min(F, B) out and hidden by the fetch window."""
    limits = [math.inf]
    if ctx.host_out_bytes_per_ms:
        limits.append(ctx.host_out_bytes_per_ms * min(fwd, bwd))
    if ctx.host_in_bytes_per_ms and ctx.schedule != "gpipe" and ctx.warmup == 0:
        return 0.0  # the last stage waits for its own swap: never free
    if ctx.host_in_bytes_per_ms:
        limits.append(ctx.host_in_bytes_per_ms * (fwd if ctx.schedule != "gpipe" else bwd))
    return min(limits)


def link_costs(request: PlanRequest, chain: ChainCosts, num_devices: int) -> list[list[float]]:
    """links[d][i]: sending layer i-1's output to a stage whose first device is d from the
    stage before it, whose last device is d - 1 (``stage_model``: links are costed between
    those two devices). With one replica per stage, d is the stage's position."""
    cluster = request.cluster
    result = [[0.0] * (chain.num_layers + 1)]
    for d in range(1, num_devices):
        bandwidth = None if cluster is None else cluster.bandwidth_gbps(d - 1, d)
        result.append([0.0] + [link_time_ms(out, bandwidth) for out in chain.layer_output])
    return result


def partition_policies(
    evaluator: StageEvaluator, bounds: list[int], solver: Solver
) -> tuple[list[float], dict[int, str]]:
    """Each stage's time for the cut points ``bounds`` (0, ..., n) and the non-keep policies
    ``solver`` chose, by layer index; a stage that cannot fit has time inf."""
    times: list[float] = []
    policies: dict[int, str] = {}
    for s, (i, j) in enumerate(pairwise(bounds)):
        value, choice = evaluator.solve(i, j, s, solver)
        times.append(value)
        if choice is not None:
            policies.update({i + k: p for k, p in enumerate(choice.policies) if p != KEEP})
    return times, policies
