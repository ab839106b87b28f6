"""``optimal``: the smallest bottleneck over every partition and every memory policy.

For a chain of layers and K stages, a dynamic program over prefixes (PipeDream §3.1 does
the same over its cost model) finds

    best(s, j) = min over i < j of max(best(s - 1, i), link(i), stage(i, j, s))

where stage(i, j, s) is the time per micro-batch of layers i..j-1 as stage s with their
fastest keep/recompute/swap choice that fits the device memory (``memopt.solve_exact``)
and link(i) the transfer of layer i-1's output to the next stage. Memory (through the
micro-batches in flight) and the swap stall depend on the stage's position, so the program
keeps s.

The program is exact; it is fast because most candidates are settled without solving their
memory subproblem:

- an upper bound U comes first, from time-balanced stages given a greedy memory choice
  (``memopt.solve_greedy``); no value above U can be part of the answer;
- stage(i, j, s) is at least the forward and backward time of its layers, which grows as i
  moves back, so for each j only the starts within U of it are tried, and only the ends j
  that leave room for the other stages within U;
- inside the window a stage is settled in O(1) when keeping every layer fits, or when
  swapping within the free transfer time frees enough, or when a lower bound (every byte
  freed at the best ratio the stage offers) already loses; otherwise ``solve_exact`` runs
  with the best value so far as its cutoff and the head max(best(s - 1, i), link(i)) as its
  floor.

``solve_exact`` caps the states it keeps; if a cap was reached anywhere, the result says
``exact: false``.
Profiles with edges are planned on their sequential backbone (``coarsen.py``).
"""

import bisect
import math
from dataclasses import dataclass

from pipestudio.planner.coarsen import plan_on_backbone
from pipestudio.planner.memopt import KEEP, StageChoice, StageProblem, solve_exact, solve_greedy
from pipestudio.planner.planners.blockpartition import block_partition
from pipestudio.planner.rangemax import RangeMax
from pipestudio.planner.request import InfeasibleError, PlannerOutput, PlanRequest
from pipestudio.planner.stage_model import StageContext, link_time_ms


@dataclass
class _Chain:
    """Prefix sums and per-layer values of a chain, for O(1) interval sums."""

    fwd: list[float]
    bwd: list[float]
    update: list[float]
    params: list[int]
    saved: list[int]
    layer_fwd: list[float]
    layer_saved: list[int]
    layer_input: list[int]
    layer_output: list[int]
    workspace: RangeMax
    largest_saved: RangeMax
    best_ratio: RangeMax

    @classmethod
    def of(cls, request: PlanRequest) -> "_Chain":
        layers = request.scaled.layers
        fwd, bwd, update, params, saved = [0.0], [0.0], [0.0], [0], [0]
        for layer in layers:
            fwd.append(fwd[-1] + layer.fwd_ms)
            bwd.append(bwd[-1] + layer.bwd_ms)
            update.append(update[-1] + layer.update_ms)
            params.append(params[-1] + layer.param_bytes)
            saved.append(saved[-1] + layer.saved_bytes)
        outputs = [layer.output_bytes for layer in layers]
        ratios = [layer.saved_bytes / layer.fwd_ms if layer.fwd_ms > 0 else math.inf
                  for layer in layers]
        return cls(fwd, bwd, update, params, saved, [layer.fwd_ms for layer in layers],
                   [layer.saved_bytes for layer in layers],
                   [request.scaled.input_bytes, *outputs[:-1]], outputs,
                   RangeMax([layer.workspace_bytes for layer in layers]),
                   RangeMax([layer.saved_bytes for layer in layers]), RangeMax(ratios))

    def base_ms(self, i: int, j: int) -> float:
        return self.fwd[j] - self.fwd[i] + self.bwd[j] - self.bwd[i]


class _Stages:
    """stage(i, j, s) of the module docstring: quick bounds, then the exact subproblem."""

    def __init__(self, chain: _Chain, contexts: list[StageContext]) -> None:
        self.chain, self.contexts = chain, contexts
        self.proven = True
        self.solved = 0

    def update_ms(self, i: int, j: int, s: int) -> float:
        update = self.chain.update[j] - self.chain.update[i]
        ctx = self.contexts[s]
        return update if ctx.schedule == "pipedream" else update / ctx.num_microbatches

    def problem(self, i: int, j: int, s: int) -> StageProblem:
        chain, ctx = self.chain, self.contexts[s]
        params = chain.params[j] - chain.params[i]
        static = params * (2 + ctx.optimizer_factor + ctx.weight_versions - 1)
        keep_all = (static + int(chain.workspace(i, j))
                    + ctx.inflight * (chain.saved[j] - chain.saved[i]))
        need = keep_all - ctx.memory_bytes if ctx.memory_bytes is not None else -1
        mode = "gpipe" if ctx.schedule == "gpipe" else ("last" if ctx.warmup == 0 else "warm")
        return StageProblem(
            fwd_ms=tuple(chain.layer_fwd[i:j]), saved_bytes=tuple(chain.layer_saved[i:j]),
            input_bytes=tuple(chain.layer_input[i:j]),
            forward_ms=chain.fwd[j] - chain.fwd[i], backward_ms=chain.bwd[j] - chain.bwd[i],
            inflight=ctx.inflight, swap_buffers=ctx.swap_buffers, need_bytes=need,
            swap_mode=mode, host_in_bytes_per_ms=ctx.host_in_bytes_per_ms,
            host_out_bytes_per_ms=ctx.host_out_bytes_per_ms)

    def bounds(self, i: int, j: int, s: int) -> tuple[float, bool]:
        """(lower bound, whether it is the exact value); inf when nothing can fit."""
        chain, ctx = self.chain, self.contexts[s]
        base = chain.base_ms(i, j) + self.update_ms(i, j, s)
        if ctx.memory_bytes is None:
            return base, True
        params = chain.params[j] - chain.params[i]
        saved = chain.saved[j] - chain.saved[i]
        static = params * (2 + ctx.optimizer_factor + ctx.weight_versions - 1)
        need = static + chain.workspace(i, j) + ctx.inflight * saved - ctx.memory_bytes
        if need <= 0:
            return base, True
        k, c = ctx.inflight, ctx.swap_buffers
        if k <= 1 or need > (k - 1) * saved:
            return math.inf, True
        fwd, bwd = chain.fwd[j] - chain.fwd[i], chain.bwd[j] - chain.bwd[i]
        free_swap = self._free_swap_bytes(fwd, bwd, ctx)
        per_byte = k - c
        if per_byte > 0:
            lo = math.ceil(need / per_byte)
            if lo <= saved and free_swap - lo >= chain.largest_saved(i, j):
                return base, True  # layers in order overshoot lo by less than one layer
        rest = need - max(per_byte, 0) * min(free_swap, saved)
        if rest <= 0:
            return base, False  # swap alone may do it, if some layers' sizes add up
        return base + rest / ((k - 1) * chain.best_ratio(i, j)), False

    @staticmethod
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

    def solve(self, i: int, j: int, s: int, floor: float, cutoff: float
              ) -> tuple[float, StageChoice | None]:
        update = self.update_ms(i, j, s)
        self.solved += 1
        choice = solve_exact(self.problem(i, j, s), cutoff - update, floor_ms=floor - update)
        if choice is None:
            return math.inf, None
        self.proven = self.proven and choice.exact
        return choice.time_ms + update, choice


def optimal(request: PlanRequest) -> PlannerOutput:
    num_stages = request.stages_required("optimal")
    if not request.scaled.is_chain:
        return plan_on_backbone(request, optimal)
    chain = _Chain.of(request)
    stages = _Stages(chain, request.contexts([1] * num_stages))
    links = _link_costs(request, chain, num_stages)
    upper = _upper_bound(request, chain, stages, links, num_stages)
    best, back = _program(chain, stages, links, num_stages, upper)
    count = len(chain.layer_fwd)
    if math.isinf(best[num_stages][count]):
        raise InfeasibleError(
            f"no split into {num_stages} stages fits the device memory, even recomputing or "
            f"swapping layers")
    partition = _partition(back, num_stages, count)
    policies: dict[int, str] = {}
    for s, layers in enumerate(partition):
        i, j = layers[0], layers[-1] + 1
        choice = solve_exact(stages.problem(i, j, s), max_states=1 << 16)
        assert choice is not None
        policies.update({i + k: p for k, p in enumerate(choice.policies) if p != KEEP})
    details = {"exact": stages.proven, "subproblems_solved": stages.solved}
    plan = request.build_plan(partition, policies, planner="optimal",
                              settings={"exact": stages.proven})
    return PlannerOutput(plan, best[num_stages][count], details)


def _program(chain: _Chain, stages: _Stages, links: list[list[float]], num_stages: int,
             upper: float) -> tuple[list[list[float]], list[list[int]]]:
    """best(s, j) and the start i that achieves it (the module docstring's program)."""
    count = len(chain.layer_fwd)
    inf = math.inf
    limit = upper * (1 + 1e-12)
    base = [f + b for f, b in zip(chain.fwd, chain.bwd, strict=True)]  # prefix sums
    best = [[inf] * (count + 1) for _ in range(num_stages + 1)]
    back = [[-1] * (count + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        previous, link = best[s - 1], links[s - 1]
        # j must leave at most (K - s) stages of work at or under the bound, and take at most
        # s such stages before it.
        first = max(s, bisect.bisect_left(base, base[count] - (num_stages - s) * limit))
        last = min(count - (num_stages - s), bisect.bisect_right(base, s * limit) - 1)
        for j in range(first, last + 1):
            current = limit
            for i in range(j - 1, s - 2, -1):
                if base[j] - base[i] >= current:
                    break  # earlier starts only add work
                head = previous[i]
                if head >= current:
                    continue
                if link[i] > head:
                    head = link[i]
                    if head >= current:
                        continue
                low, settled = stages.bounds(i, j, s - 1)
                if low >= current:
                    continue
                if not settled:
                    low, _ = stages.solve(i, j, s - 1, head, current)
                value = head if head > low else low
                if value < current:
                    current, best[s][j], back[s][j] = value, value, i
    return best, back


def _upper_bound(request: PlanRequest, chain: _Chain, stages: _Stages,
                 links: list[list[float]], num_stages: int) -> float:
    """The bottleneck of time-balanced stages with greedy memory choices (inf if one does
    not fit): any value above it cannot be part of the optimum."""
    times = [fwd + bwd for fwd, bwd in zip(chain.layer_fwd, _layer_bwd(chain), strict=True)]
    ends = block_partition(times, num_stages)
    value, start = 0.0, 0
    for s, end in enumerate(ends):
        low, settled = stages.bounds(start, end, s)
        if not settled:
            choice = solve_greedy(stages.problem(start, end, s))
            if choice is None:
                return math.inf
            low = choice.time_ms + stages.update_ms(start, end, s)
        value = max(value, low, links[s][start] if s else 0.0)
        start = end
    return value


def _layer_bwd(chain: _Chain) -> list[float]:
    return [b - a for a, b in zip(chain.bwd, chain.bwd[1:], strict=False)]


def _link_costs(request: PlanRequest, chain: _Chain, num_stages: int) -> list[list[float]]:
    """links[s][i]: sending layer i-1's output from stage s-1 to stage s (devices in order)."""
    cluster = request.cluster
    result = [[0.0] * (len(chain.layer_output) + 1)]
    for s in range(1, num_stages):
        bandwidth = None if cluster is None else cluster.bandwidth_gbps(s - 1, s)
        result.append([0.0] + [link_time_ms(out, bandwidth) for out in chain.layer_output])
    return result


def _partition(back: list[list[int]], num_stages: int, count: int) -> list[list[int]]:
    partition: list[list[int]] = []
    j = count
    for s in range(num_stages, 0, -1):
        i = back[s][j]
        partition.append(list(range(i, j)))
        j = i
    partition.reverse()
    return partition
