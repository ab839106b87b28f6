"""A lower bound on a plan's simulated step time, built stage by stage: ``optimal``'s pruning.

The bottleneck the program minimises (``cost_model/stage.py``) is a proxy: the simulator's step
also pays the pipeline's fill and drain, GPipe's separate forward and backward phases and
transfers on a micro-batch's round trip. To find the fastest simulated plan among many
without simulating each, ``optimal_refine`` needs a bound it can check stage by stage.

Synchronous schedules (gpipe, 1f1b). For stage s with r_s replicas, F_s, R_s, B_s one
micro-batch's forward, recompute and backward, U_s the update, A_s the all-reduce
(``stage_model``), a_s and g_s the least activation and gradient transfer between a device
of stage s and a device after it, m micro-batches::

    step >= head_s + (m / r_s) (F_s + R_s + B_s) + max(A_s + U_s, tail_s + A_0 + U_0)
    head_s = sum over t < s of (F_t + a_t)        tail_s = sum over t < s of (g_t + R_t + B_t)

for every s (``simulator/simulate.py``): a replica of stage s starts with the forward of its first
micro-batch, which waits for that micro-batch's forward and transfer on every earlier stage;
its device then runs the passes of its m / r_s micro-batches one at a time; after its last
backward it all-reduces and updates, and that backward's gradient goes back through every
earlier stage's recompute and backward before stage 0 (whose last backward it then is at
the latest) all-reduces and updates. Stalls, queues and swap only add. The bound is nearly
tight for 1F1B and for GPipe it is the flow shop's bound at the slowest stage; the largest
s gives (m + s) x a stage's time for balanced stages, the fill and drain the bottleneck
leaves out.

pipedream never flushes: a step is a window of a steady stream, so only the steady state
bounds it: each replica computes its m / r_s micro-batches' F + R + B and an update after
each backward, so ``step >= max_s (m / r_s)(F_s + R_s + B_s + U_s)``. That holds for the mean
of many steps; one measured step could in principle be shorter than the mean where the
steady state repeats over several steps, so for pipedream the bound is tested against the
simulator (tests/planner/algorithms/optimal/test_optimal.py) rather than proven.

A plan's bound is the largest term, so a prefix of stages bounds every plan that starts with
it; ``completion_ms`` bounds the stages still to come from the layers they must hold.
"""

from dataclasses import dataclass

from pipestudio.planner.algorithms.optimal.program import DeviceLayout
from pipestudio.planner.algorithms.request import PlanRequest
from pipestudio.planner.cost_model.chain import ChainCosts
from pipestudio.planner.cost_model.stage import StageContext
from pipestudio.planner.units import transfer_ms


@dataclass(frozen=True)
class Prefix:
    """The first stages of a plan: their bound, and what later stages' terms add to."""

    bound_ms: float = 0.0
    head_ms: float = 0.0  # forwards and activation transfers before the next stage
    tail_ms: float = 0.0  # gradient transfers, recomputes and backwards back to stage 0
    first_update_ms: float = 0.0  # stage 0's all-reduce and update (A_0 + U_0)


class StepBound:
    """The bound of the module docstring for the stages ``optimal`` can form."""

    def __init__(self, request: PlanRequest, chain: ChainCosts, layout: DeviceLayout) -> None:
        self.chain, self.layout = chain, layout
        self.m = request.num_microbatches
        self.sync = request.schedule != "pipedream"
        cluster, num_devices = request.cluster, layout.num_devices
        # fastest[d0][r]: the fastest link from a device of d0..d0+r-1 to a later one
        self.fastest: dict[tuple[int, int], float | None] = {}
        for first, r in layout.context_index:
            rates = (
                []
                if cluster is None
                else [
                    cluster.bandwidth_gbps(a, b)
                    for a in range(first, first + r)
                    for b in range(first + r, num_devices)
                ]
            )
            self.fastest[(first, r)] = (
                None
                if None in rates or not rates
                else max(rate for rate in rates if rate is not None)
            )

    def link_ms(self, first: int, replicas: int, end: int) -> float:
        """The least time to send layer end-1's output from the stage to the next one."""
        return transfer_ms(self.chain.layer_output[end - 1], self.fastest[(first, replicas)])

    def fixed_ms(self, i: int, j: int, ctx: StageContext) -> float:
        """A_s + U_s of layers i..j-1: the all-reduce and update after the last backward."""
        chain = self.chain
        return (
            chain.update[j]
            - chain.update[i]
            + ctx.allreduce_ms_per_param_byte * (chain.params[j] - chain.params[i])
        )

    def term_ms(
        self, prefix: Prefix, i: int, j: int, ctx: StageContext, recompute_ms: float, first: bool
    ) -> float:
        """The stage's term given the stages before it (``first``: it is stage 0)."""
        chain, per_replica = self.chain, self.m / ctx.replicas
        passes = chain.base_ms(i, j) + recompute_ms
        if not self.sync:
            return per_replica * (passes + chain.update[j] - chain.update[i])
        fixed = self.fixed_ms(i, j, ctx)
        back = fixed if first else max(fixed, prefix.tail_ms + prefix.first_update_ms)
        return prefix.head_ms + per_replica * passes + back

    def extend(
        self,
        prefix: Prefix,
        i: int,
        j: int,
        first_device: int,
        ctx: StageContext,
        recompute_ms: float,
    ) -> Prefix:
        """The prefix with layers i..j-1 as its next stage, on devices from ``first_device``."""
        first = first_device == 0
        term = self.term_ms(prefix, i, j, ctx, recompute_ms, first)
        bound = max(prefix.bound_ms, term)
        if not self.sync:
            return Prefix(bound)
        chain = self.chain
        link = self.link_ms(first_device, ctx.replicas, j) if j < chain.num_layers else 0.0
        return Prefix(
            bound,
            prefix.head_ms + chain.fwd[j] - chain.fwd[i] + link,
            prefix.tail_ms + link + recompute_ms + chain.bwd[j] - chain.bwd[i],
            self.fixed_ms(i, j, ctx) if first else prefix.first_update_ms,
        )

    def completion_ms(self, prefix: Prefix, j: int, devices_left: int) -> float:
        """A bound on the terms of any stages that hold layers j..n-1 on ``devices_left``
        devices after ``prefix``: one of them has compute / replicas at least the layers'
        compute over the devices (sum C_t / sum r_t), and its head and tail at least the
        prefix's."""
        chain = self.chain
        count = chain.num_layers
        if j == count:
            return prefix.bound_ms
        spread = self.m / devices_left
        if not self.sync:
            work = chain.base_ms(j, count) + chain.update[count] - chain.update[j]
            return max(prefix.bound_ms, spread * work)
        return max(
            prefix.bound_ms,
            prefix.head_ms
            + spread * chain.base_ms(j, count)
            + prefix.tail_ms
            + prefix.first_update_ms,
        )
