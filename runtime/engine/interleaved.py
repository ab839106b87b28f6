"""An ``interleaved-1f1b`` rank: the chunks it holds, run in one order.

Rank d of p holds chunks d, d + p, ... (``virtual_stages`` of them, ``layout.py``). Each
chunk is a ``Worker`` of its own (its layers, optimizer, transfers and metrics, as a stage
of any plan); this driver runs their forwards and backwards in Megatron-LM's order
(``pipestudio.planner.simulator.schedule.interleaved_order``, the simulator's), then each
chunk's update, step by step. Before each op it posts the receives of the next two compute
ops, whichever chunks they belong to, as a one-stage worker does. A chunk's tensors go to
the next chunk's rank like any stage's (tags tell the layers apart), so the wrap from the
last rank back to rank 0 is a transfer like the others.
"""

import itertools

from pipestudio.planner.simulator.schedule import FORWARD, interleaved_order
from pipestudio.runtime.engine.config import EngineConfig
from pipestudio.runtime.engine.execution.transport import ACTIVATION, GRADIENT
from pipestudio.runtime.engine.faults import Watchdog
from pipestudio.runtime.engine.layout import EngineLayout
from pipestudio.runtime.engine.ops import Op
from pipestudio.runtime.engine.rendezvous import RankContext
from pipestudio.runtime.engine.telemetry.metrics import EventSink
from pipestudio.runtime.engine.worker import _LOOKAHEAD, Worker, describe_op
from pipestudio.runtime.models import ModelSpec

Scheduled = tuple[Worker, Op]


class ChunkedRank:
    """The chunks of one rank and their order (see the module docstring)."""

    def __init__(
        self,
        config: EngineConfig,
        spec: ModelSpec,
        layout: EngineLayout,
        ctx: RankContext,
        watchdog: Watchdog,
        sink: EventSink,
    ) -> None:
        self.config, self.layout, self.ctx, self.watchdog = config, layout, ctx, watchdog
        self.workers = [
            Worker(config, spec, layout, ctx, watchdog, sink, worker=worker)
            for worker in layout.workers_of(ctx.rank)
        ]
        self._by_stage = {worker.stage_idx: worker for worker in self.workers}
        for worker in self.workers[1:]:  # a wait of any chunk makes the data of any other
            worker.data = self.workers[0].data

    def train(self, start_step: int) -> None:
        every = self.config.checkpoint_every
        for worker in self.workers:
            worker.live.start(start_step)
        for step in range(start_step, self.config.steps):
            self.run_step(step)
            end = step + 1
            if self.config.checkpoint_dir and (
                end == self.config.steps or (every and end % every == 0)
            ):
                for idx, worker in enumerate(self.workers):
                    worker.save(end, publish=idx == len(self.workers) - 1)
        for worker in self.workers:
            worker.live.finish()

    def ops(self, step: int) -> list[Scheduled]:
        """The step's forwards and backwards of every chunk in order, then the updates."""
        plan = self.layout.plan
        devices, first = plan.num_workers, step * plan.num_microbatches
        microbatches = list(range(first, first + plan.num_microbatches))
        order = interleaved_order(self.ctx.rank, devices, plan.virtual_stages, microbatches)
        ops: list[Scheduled] = [
            (
                self._by_stage[chunk * devices + self.ctx.rank],
                Op("forward" if kind == FORWARD else "backward", mb, step),
            )
            for kind, chunk, mb in order
        ]
        return ops + [(worker, Op("update", None, step)) for worker in self.workers]

    def run_step(self, step: int) -> None:
        ops = self.ops(step)
        for worker in self.workers:
            worker.last_backward = {
                step: next(
                    op.microbatch
                    for w, op in reversed(ops)
                    if w is worker and op.kind == "backward"
                )
            }
        for idx, (worker, op) in enumerate(ops):
            self._prepare(ops, idx)
            following = ops[idx + 1] if idx + 1 < len(ops) else None
            worker.backward_next = (
                following[1].microbatch
                if following is not None
                and following[0] is worker
                and following[1].kind == "backward"
                else None
            )
            self.watchdog.doing(f"{describe_op(op)} of stage {worker.stage_idx}")
            if self.config.before_op is not None:
                self.config.before_op(self.ctx.rank, op)
            worker._run(op)
            worker.transport.reap()
        for worker in self.workers:
            worker._finish_step(step)
        for worker in self.workers:
            worker.transport.drain()
            worker.recorder.flush()

    def _prepare(self, ops: list[Scheduled], idx: int) -> None:
        """Post the receives of the next compute ops, whichever chunks they are of: the
        next ``_LOOKAHEAD``, and as many more as the rank has chunks besides, once the
        shapes they need are known (posting a receive of an unknown shape waits for its
        sender to publish it, which in the first step may wait on this rank); want the
        data of the next forward after this op (``execution/data.py``); prefetch swapped
        tensors."""
        ahead = [(w, op) for w, op in ops[idx:] if op.kind in ("forward", "backward")]
        for count, (worker, op) in enumerate(ahead[: _LOOKAHEAD * len(self.workers)]):
            assert op.microbatch is not None
            io = worker.io_for(op.microbatch)
            needed = io.receives if op.kind == "forward" else io.sends
            if count >= _LOOKAHEAD and not worker.transport.knows_shapes(needed):
                continue
            if op.kind == "forward":
                worker._post(ACTIVATION, op.microbatch, io.receives)
            elif op.microbatch in worker.states:
                worker._post(GRADIENT, op.microbatch, worker._float_sends(op.microbatch))
        later = itertools.islice(ops, idx + 1, None)
        forward = next(((w, op) for w, op in later if op.kind == "forward"), None)
        if forward is not None:
            forward[0].want_data([forward[1]])
        following = ops[idx + 1] if idx + 1 < len(ops) else None
        if following is not None and following[1].kind == "backward":
            worker, op = following
            assert op.microbatch is not None
            worker._swap_in(op.microbatch, op.step)
