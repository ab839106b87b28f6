"""One rank's training loop: runs its worker's ops in schedule order (``ops.py``).

Before each op the worker posts the receives of its next two compute ops, so their tensors
arrive while it computes (and, when the next op is a backward with swapped tensors, starts
fetching them: the schedule knows what comes next). A forward whose own backward comes
right after it keeps its swapped tensors on the device: they would only come straight
back. A forward waits for its inputs, runs the stage and sends its outputs; a backward
waits for the gradients of what it sent, runs autograd and sends the gradients of what it
received (under ``zero-bubble`` only its input half: the weight half is an op of its own,
later); an all-reduce sums the replicas' gradients; an update steps the optimizer. Under
``pipedream`` the forward and backward run on stashed weight versions (``execution/weights.py``).
When a step's last op is done the worker publishes the step's ops and metrics; after
the first one it settles the heap (``src/pipestudio/gc_freeze.py``), so that no full collection
stalls the pipeline for 0.1-0.2 s later on.

The last stage checks each step's loss there, once its ``step`` event is out: the loss is
the sum of the step's micro-batch losses, which the recorder accumulates on the device
and brings to the host once per step for that event anyway, so the check costs no
synchronisation; a sum is NaN or infinite when one of its terms is. With
``on_nonfinite_loss="fail"`` a non-finite one raises ``NonFiniteLoss`` after recording it
as the root of the job's failure (``faults.py``): this rank then leaves, the waits of the
others on it fail within moments, and each of them reports this reason (and that another
attempt would not help) instead of a timeout.

Under ``fp16`` the last stage's backwards start from the loss scale, and every update
first agrees with all ranks whether any gradient of the step overflowed: if one did, no
rank updates and the scale halves (``execution/scaling.py``).

Live migration (``migration/executor.py``): each micro-batch runs on the partition in effect
for it, so the stage's layers, the tensors it receives and sends, and its optimizer may
change between two micro-batches; before the worker first touches an op of a step it learns the
migrations announced for it, and its updates release the layer state due to move.
"""

import itertools
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor

from pipestudio.gc_freeze import settle_heap
from pipestudio.runtime.backward_split import WeightWork
from pipestudio.runtime.engine import checkpoint as ckpt
from pipestudio.runtime.engine.config import EngineConfig
from pipestudio.runtime.engine.errors import NonFiniteLoss
from pipestudio.runtime.engine.execution.data import DataAhead
from pipestudio.runtime.engine.execution.replicas import allreduce_gradients
from pipestudio.runtime.engine.execution.scaling import LossScaler
from pipestudio.runtime.engine.execution.stage import ForwardState, StageRunner
from pipestudio.runtime.engine.execution.swap import SwapSpace
from pipestudio.runtime.engine.execution.transport import ACTIVATION, GRADIENT, Pending, Transport
from pipestudio.runtime.engine.execution.weights import WeightVersions, set_gradients
from pipestudio.runtime.engine.faults import Watchdog
from pipestudio.runtime.engine.layout import EngineLayout, StageIO, Transfer
from pipestudio.runtime.engine.migration.coordinator import MigrationControl
from pipestudio.runtime.engine.migration.executor import MigrationExecutor
from pipestudio.runtime.engine.ops import Op, first_stage_versions, segments, worker_ops
from pipestudio.runtime.engine.rendezvous import RankContext
from pipestudio.runtime.engine.telemetry.clock import Marker
from pipestudio.runtime.engine.telemetry.meter import LayerMeter
from pipestudio.runtime.engine.telemetry.metrics import EventSink, Recorder
from pipestudio.runtime.models import ModelSpec
from pipestudio.runtime.optimizers import make_optimizer

_LOOKAHEAD = 2


class Worker:
    """The training loop of one rank (see the module docstring)."""

    def __init__(
        self,
        config: EngineConfig,
        spec: ModelSpec,
        layout: EngineLayout,
        ctx: RankContext,
        watchdog: Watchdog,
        sink: EventSink,
        worker: tuple[int, int] | None = None,
    ) -> None:
        """``worker``: the (stage, replica) to run, when the rank runs several (chunks of
        an interleaved plan: ``interleaved.py``); by default the rank's one."""
        self.config, self.spec, self.layout, self.ctx = config, spec, layout, ctx
        self.plan = layout.plan
        self.watchdog = watchdog
        self.stage_idx, self.replica = worker or layout.worker(ctx.rank)
        self.io = layout.stages[self.stage_idx]
        self.recorder = Recorder(
            self.stage_idx,
            self.replica,
            Marker(ctx.clock, ctx.device),
            sink,
            self.plan.num_microbatches * self.plan.microbatch_size,
        )
        self.swap = SwapSpace(ctx.device)
        self.backward_next: int | None = None  # the micro-batch whose backward comes next
        self.stage = StageRunner(
            dict(spec.layers),
            self.io,
            spec.graph_inputs(),
            spec.loss,
            self.plan.num_microbatches,
            ctx.device,
            self.swap,
            self.recorder,
            self.plan.precision,
            split_backward=self.plan.schedule == "zero-bubble",
        )
        #: zero-bubble: per micro-batch, what its weight half needs (``_weight``).
        self.weight_work: dict[int, WeightWork] = {}
        self.optimizer = self.make_optimizer(
            [p for p in self.stage.params.values() if p.requires_grad]
        )
        self.scaler = (
            LossScaler(config.loss_scale, config.loss_scale_growth_interval)
            if self.plan.precision == "fp16"
            else None
        )
        self.transport = Transport(ctx, layout, self.recorder, watchdog)
        #: the data of the next forwards, made while this rank waits (``execution/data.py``)
        self.data = DataAhead(spec.sample, self.plan.microbatch_size)
        self.states: dict[int, ForwardState] = {}
        self.posted: dict[tuple[str, int], list[tuple[str, Pending]]] = {}
        self.versions: WeightVersions | None = None
        self.max_versions = 0
        enabled = config.migration is not None and config.migration.enabled
        self.control = (
            MigrationControl(config, spec, ctx.rank, ctx.world_size, ctx.store, self.recorder.sink)
            if enabled
            else None
        )
        control = self.control
        self.live = MigrationExecutor(self, control)
        self.meter = LayerMeter(spec.layers) if control is not None and control.measures else None
        #: Whether the heap was settled after the first step (``src/pipestudio/gc_freeze.py``).
        self.settled = False
        #: Per step of the current segment, the micro-batch of this worker's last backward.
        self.last_backward: dict[int, int | None] = {}

    def make_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer | None:
        if not params:
            return None
        optimizer = make_optimizer(self.plan.optimizer, params)
        if self.config.lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = self.config.lr
        return optimizer

    @property
    def workers(self) -> list["Worker"]:
        """The stage workers this rank runs: this one (``interleaved.py`` has several)."""
        return [self]

    def io_for(self, microbatch: int) -> StageIO:
        return self.live.partition(microbatch).io

    def train(self, start_step: int) -> None:
        every = self.config.checkpoint_every
        self.live.start(start_step)
        for first, count in segments(self.plan, start_step, self.config.steps, every):
            self.run_segment(first, count)
            end = first + count
            if self.config.checkpoint_dir and (
                end == self.config.steps or (every and end % every == 0)
            ):
                self.save(end)
        self.live.finish()

    def run_segment(self, first_step: int, num_steps: int) -> None:
        ops = worker_ops(self.plan, self.stage_idx, self.replica, first_step, num_steps)
        if self.plan.schedule == "pipedream":
            required = (
                first_stage_versions(self.plan, first_step, num_steps)
                if self.plan.vertical_sync
                else None
            )
            self.versions = WeightVersions(
                self.live.owned,
                self.layout.replicas(self.stage_idx),
                first_step * self.plan.num_microbatches,
                [op.microbatch for op in ops if op.kind == "forward" and op.microbatch is not None],
                required,
                self.live.before_snapshot,
                self.live.fetch,
                self.live.older_versions,
            )
        left = Counter(op.step for op in ops)
        self.last_backward = {op.step: op.microbatch for op in ops if op.kind == "backward"}
        for idx, op in enumerate(ops):
            self.live.learn_until(max(o.step for o in ops[idx : idx + 3 * _LOOKAHEAD]))
            self._prepare(ops, idx)
            following = ops[idx + 1] if idx + 1 < len(ops) else None
            self.backward_next = (
                following.microbatch
                if following is not None and following.kind == "backward"
                else None
            )
            self.watchdog.doing(describe_op(op))
            if self.config.before_op is not None:
                self.config.before_op(self.ctx.rank, op)
            self._run(op)
            self.transport.reap()
            left[op.step] -= 1
            if left[op.step] == 0:
                self._finish_step(op.step)
        self.transport.drain()
        self.recorder.flush()

    def _finish_step(self, step: int) -> None:
        """Publish the step's metrics, then check its loss (module docstring)."""
        if self.plan.schedule != "pipedream":
            self.transport.drain()
        loss = self.recorder.finish_step(step).get("loss")
        if loss is not None and not math.isfinite(loss) and self.config.on_nonfinite_loss == "fail":
            failure = NonFiniteLoss(loss, step, self.stage_idx, self.ctx.rank)
            self.watchdog.record_failure(self.ctx.rank, str(failure), retry=False)
            raise failure
        if not self.settled:  # torch imports what the first step needed lazily
            settle_heap()
            self.settled = True
        if self.control is not None:
            self.control.after_step(step, self.recorder, self.meter)

    def _prepare(self, ops: list[Op], idx: int) -> None:
        """Post the receives of the next compute ops; want the data of the forward after
        this op (``execution/data.py``); prefetch swapped tensors."""
        ahead = [op for op in ops[idx:] if op.kind in ("forward", "backward")][:_LOOKAHEAD]
        for op in ahead:
            assert op.microbatch is not None
            if op.kind == "forward":
                self._post(ACTIVATION, op.microbatch, self.io_for(op.microbatch).receives)
            elif op.microbatch in self.states:
                self._post(GRADIENT, op.microbatch, self._float_sends(op.microbatch))
        self.want_data(itertools.islice(ops, idx + 1, None))
        following = ops[idx + 1] if idx + 1 < len(ops) else None
        if following is not None and following.kind == "backward":
            assert following.microbatch is not None
            self._swap_in(following.microbatch, following.step)

    def want_data(self, later: Iterable[Op]) -> None:
        """Want the data of the first forward among ``later``, if it reads any: it is made
        in this rank's next wait for a peer (``execution/data.py``)."""
        forward = next((op for op in later if op.kind == "forward"), None)
        if forward is not None and forward.microbatch is not None:
            io = self.io_for(forward.microbatch)
            if io.reads_data or io.has_loss:
                self.data.want(forward.microbatch)

    def _float_sends(self, microbatch: int) -> list[Transfer]:
        return [
            t
            for t in self.io_for(microbatch).sends
            if self.transport.shape(t.layer)[0].is_floating_point
        ]

    def _post(self, direction: str, microbatch: int, transfers: Sequence[Transfer]) -> None:
        key = (direction, microbatch)
        if key not in self.posted:
            self.posted[key] = [
                (t.layer, self.transport.post(direction, t, microbatch)) for t in transfers
            ]

    def _received(self, direction: str, microbatch: int) -> list[tuple[str, Tensor]]:
        pending = self.posted.pop((direction, microbatch), [])
        self.data.while_waiting(lambda: self.transport.arrived([p for _, p in pending]))
        return [(layer, self.transport.wait(p)) for layer, p in pending]

    def _run(self, op: Op) -> None:
        if hasattr(self.spec, "apply_step"):
            self.spec.apply_step(op.step)
        if op.kind == "forward":
            assert op.microbatch is not None
            self._forward(op.microbatch, op.step)
        elif op.kind == "backward":
            assert op.microbatch is not None
            self._backward(op.microbatch, op.step)
        elif op.kind == "weight":
            assert op.microbatch is not None
            self._weight(op.microbatch, op.step)
        elif op.kind == "allreduce":
            self._allreduce(op)
        else:
            self._update(op)

    def _forward(self, mb: int, step: int) -> None:
        part = self.live.partition(mb)
        io = part.io
        self._post(ACTIVATION, mb, io.receives)
        # layers arriving for ``mb``: each is waited for just before it runs, so the
        # layers before it overlap its transfer
        before_layer = None
        weights: Mapping[str, Tensor]
        if self.versions is None:
            weights = part.runner.params
            if self.live.arriving:

                def before_layer(layer: str) -> None:
                    self.live.ensure_arrived(mb, layer)
        else:
            weights = part.positional(
                self.versions.for_forward(mb, [full for _, full in part.keys])
            )
            self.max_versions = max(self.max_versions, self.versions.num_versions)
        received = {
            layer: tensor.requires_grad_(tensor.is_floating_point())
            for layer, tensor in self._received(ACTIVATION, mb)
        }
        data = targets = None
        if io.reads_data or io.has_loss:
            data, targets = self.data.take(mb)
            data, targets = data.to(self.ctx.device), targets.to(self.ctx.device)
        self.watchdog.doing(f"the forward of micro-batch {mb} (step {step})")
        record = self.recorder.start("forward", mb, step)
        if self.meter is not None:
            self.meter.arm(True)
        state = part.runner.forward(
            mb, step, received, data if io.reads_data else None, targets, weights, before_layer
        )
        if self.meter is not None:
            self.meter.arm(False)
        self.recorder.stop(record)
        if state.loss is not None:
            self.recorder.add_loss(step, state.loss)
        for transfer in io.sends:
            self.transport.send(ACTIVATION, transfer, mb, state.outputs[transfer.layer], step)
        self.states[mb] = state
        if self.backward_next != mb:  # else the tensors would come straight back
            self._swap_out(mb, step)

    def _backward(self, mb: int, step: int) -> None:
        part = self.live.partition(mb)
        self._post(GRADIENT, mb, self._float_sends(mb))
        grads: dict[str, Tensor] = {}
        for layer, grad in self._received(GRADIENT, mb):
            grads[layer] = grads[layer] + grad if layer in grads else grad
        state = self.states.pop(mb)
        self.watchdog.doing(f"the backward of micro-batch {mb} (step {step})")

        def hand_on(input_grads: dict[str, Tensor]) -> None:
            for transfer in part.io.receives:
                if transfer.layer in input_grads:
                    self.transport.send(GRADIENT, transfer, mb, input_grads[transfer.layer], step)

        # the step's last backward: the previous stage waits for it with nothing else to
        # do, and this one has only its update left, so its gradients go first
        first = (
            hand_on
            if self.versions is None and self.meter is None and self.last_backward.get(step) == mb
            else None
        )
        scale = None if self.scaler is None else self.scaler.scale
        record = self.recorder.start("backward", mb, step)
        if part.runner.split_backward:  # zero-bubble: the weight half comes later
            input_grads, self.weight_work[mb] = part.runner.backward_input(state, grads, scale)
            self.recorder.stop(record)
            hand_on(input_grads)
            return
        weight_grads, input_grads = part.runner.backward(state, grads, first, scale)
        self.recorder.stop(record)
        set_gradients(part.runner.params, weight_grads, accumulate=self.versions is None)
        hand_on(input_grads)
        self.swap.release(mb)
        if self.versions is not None:
            self.versions.release(mb)

    def _weight(self, mb: int, step: int) -> None:
        """zero-bubble's weight half of ``mb``'s backward (``execution/stage.py``)."""
        self.watchdog.doing(f"the weight gradients of micro-batch {mb} (step {step})")
        record = self.recorder.start("weight", mb, step)
        self.live.partition(mb).runner.backward_weight(self.weight_work.pop(mb))
        self.recorder.stop(record)
        self.swap.release(mb)

    def _allreduce(self, op: Op) -> None:
        group = self.ctx.groups.replicas
        assert group is not None
        record = self.recorder.start("allreduce", op.microbatch, op.step)
        what = (
            f"the all-reduce of stage {self.stage_idx}'s gradients (step {op.step}"
            + ("" if op.microbatch is None else f", micro-batch {op.microbatch}")
            + ")"
        )
        staged = self.ctx.groups.replicas_on_cpu and self.ctx.device.type == "cuda"
        allreduce_gradients(
            self.stage.params, group, staged, self.ctx.timeout_s, self.watchdog, what
        )
        self.recorder.stop(record)

    def _update(self, op: Op) -> None:
        self.watchdog.doing(f"the update of step {op.step}")
        record = self.recorder.start("update", op.microbatch, op.step)
        if self.versions is not None:
            assert op.microbatch is not None
            self.live.ensure_arrived(op.microbatch)
            self.versions.before_update()
        if self.config.before_update is not None:
            self.config.before_update(self.ctx.rank, op.step, self.live.owned)
        skip = self._overflowed(op.step)
        if self.live.untrained and not skip:
            # layers whose optimizer state is still on its way are not in the optimizer:
            # update the others while it travels, then those layers alone
            self._step()
        self.live.ensure_trainable()
        if not skip:
            self._step()
        if self.versions is not None:
            self.versions.after_update()
        self.recorder.stop(record)
        num_microbatches = self.plan.num_microbatches
        self.live.after_update(
            op.microbatch + 1 if op.microbatch is not None else (op.step + 1) * num_microbatches
        )

    def _overflowed(self, step: int) -> bool:
        """fp16: whether any rank's gradients of ``step`` overflowed, in which case this
        rank drops its own; else they are unscaled (``execution/scaling.py``)."""
        if self.scaler is None:
            return False
        params = list(self.live.owned.values())
        found = self.scaler.agree(
            self.scaler.overflowed(params), self.ctx.timeout_s, self.watchdog, step
        )
        if found:
            for param in params:
                param.grad = None
        else:
            self.scaler.unscale(params)
        self.recorder.add_loss_scale(step, self.scaler.scale, found)
        self.scaler.update(found)
        return found

    def _step(self) -> None:
        """Apply the gradients there are (a parameter without one is left as it is)."""
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def _swap_out(self, mb: int, step: int) -> None:
        num_bytes = self.swap.num_bytes(mb)
        if not num_bytes:
            return
        events = self.swap.swap_out(mb)
        now = self.recorder.marker.mark()
        start, end = events if events is not None else (now, now)
        self.recorder.span("swap_out", mb, step, start, end, num_bytes)

    def _swap_in(self, mb: int, step: int) -> None:
        num_bytes = self.swap.num_bytes(mb)
        if (
            not num_bytes
            or mb not in self.states
            or (self.swap.moves and not self.swap.on_host(mb))
        ):
            return  # nothing swapped, or already fetched
        events = self.swap.swap_in(mb)
        now = self.recorder.marker.mark()
        start, end = events if events is not None else (now, now)
        self.recorder.span("swap_in", mb, step, start, end, num_bytes)

    def save(self, step: int, *, publish: bool = True) -> None:
        """Write this worker's checkpoint; rank 0 publishes it once every worker has (the
        last of its chunks does, interleaved: ``publish``)."""
        root = self.config.checkpoint_dir
        assert root is not None
        first_microbatch = step * self.plan.num_microbatches
        self.live.ensure_arrived(first_microbatch)
        self.live.ensure_trainable()
        part = self.live.partition(first_microbatch)
        ckpt.save_rank(
            root,
            step,
            self.stage_idx,
            self.replica,
            part.runner.module,
            self.optimizer,
            self.ctx.device,
            self.scaler,
        )
        self.ctx.store.add(f"checkpoint/{step}", 1)
        if self.ctx.rank == 0 and publish:
            self.watchdog.doing(f"waiting for every rank's checkpoint of step {step}")
            deadline = time.time() + self.ctx.timeout_s
            polls = 0
            while self.ctx.store.add(f"checkpoint/{step}", 0) < len(self.layout.workers):
                # a rank that failed meanwhile (a non-finite loss on the last stage at the
                # end of this segment) never checkpoints: end now, not at the timeout. Only
                # a failure record counts: a heartbeat may pause while a rank pickles a
                # big checkpoint.
                polls += 1
                if time.time() > deadline or (
                    polls % 10 == 0 and self.watchdog.root_failure(heartbeats=False) is not None
                ):
                    raise self.watchdog.failure(
                        f"waiting for the checkpoint of step {step}", None, TimeoutError(step)
                    )
                time.sleep(0.05)
            control = self.live.control
            ckpt.publish(
                root,
                step,
                part.plan,
                self.config.model,
                self.config.model_args,
                control.record(step) if control is not None else None,
            )
        self.recorder.sink(
            {
                "type": "checkpoint",
                "stage": self.stage_idx,
                "replica": self.replica,
                "step": step,
                "dir": root,
            }
        )


def describe_op(op: Op) -> str:
    if op.microbatch is None:
        return f"the {op.kind} of step {op.step}"
    return f"the {op.kind} of micro-batch {op.microbatch} (step {op.step})"
