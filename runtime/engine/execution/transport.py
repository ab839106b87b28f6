"""Activations forward and gradients backward between stages, point to point.

Each boundary tensor (``layout.Transfer``) goes once per micro-batch from the rank of its
stage that ran the micro-batch to the rank of the destination stage that runs it, with
``isend``/``irecv``; its gradient comes back the same way. Every floating-point tensor sent
gets a gradient back (zeros when the receiver's loss does not depend on it), so both sides
agree on the messages without asking. Receives are posted ahead of the op that needs
them (``worker.py`` posts those of the next two compute ops) and sends are waited for only
when their buffer must be reused, so transfers overlap computation.

Shapes are exchanged once, through the store: after its first forward the producing stage
publishes each boundary tensor's dtype and shape under the layer's name, and receivers
read it once and allocate every later buffer from it. Micro-batches all have the plan's
size, so a later micro-batch of another shape is a model error, reported by layer name.

Gloo matches a receive to its send by (source, tag), the tag coding the micro-batch, the
layer and the direction; NCCL matches them in order, which holds because both ends of a
pair iterate micro-batches and layers in the same order. Every wait has the job's timeout
and a failed wait is diagnosed by the watchdog (``faults.py``).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.faults import Watchdog
from pipestudio.runtime.engine.layout import EngineLayout, Transfer
from pipestudio.runtime.engine.rendezvous import RankContext
from pipestudio.runtime.engine.telemetry.metrics import OpRecord, Recorder

ACTIVATION, GRADIENT = "activation", "gradient"


def isend(tensor: Tensor, peer: int, tag: int, group: dist.ProcessGroup | None = None) -> dist.Work:
    """``dist.isend``, whose handle is None only on a rank outside ``group``: never here."""
    work = dist.isend(tensor, peer, group=group, tag=tag)
    assert work is not None, f"this rank is not in the group it sends to {peer} in"
    return work


def irecv(tensor: Tensor, peer: int, tag: int, group: dist.ProcessGroup | None = None) -> dist.Work:
    """``dist.irecv``, as ``isend``."""
    work = dist.irecv(tensor, peer, group=group, tag=tag)
    assert work is not None, f"this rank is not in the group it receives from {peer} in"
    return work


@dataclass
class Pending:
    """A posted receive."""

    work: dist.Work
    buffer: Tensor
    peer: int
    what: str


@dataclass
class _Send:
    work: dist.Work
    buffer: Tensor
    record: OpRecord
    peer: int


class Transport:
    """Point-to-point transfers of one rank (see the module docstring)."""

    def __init__(
        self, ctx: RankContext, layout: EngineLayout, recorder: Recorder, watchdog: Watchdog
    ) -> None:
        self.ctx, self.layout, self.recorder, self.watchdog = ctx, layout, recorder, watchdog
        self.num_layers = len(layout.layer_index)
        self.timeout = timedelta(seconds=ctx.timeout_s)
        self._shapes: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
        self._sends: list[_Send] = []

    def _tag(self, direction: str, transfer: Transfer, microbatch: int) -> int:
        return (microbatch * self.num_layers + transfer.layer_idx) * 2 + (direction == GRADIENT)

    def _route(self, peer: int, direction: str) -> tuple[dist.ProcessGroup | None, bool]:
        """(group, staged): NCCL between different GPUs, else gloo (staged on CUDA)."""
        if peer in self.ctx.groups.nccl_peers:
            groups = self.ctx.groups
            return (groups.activation if direction == ACTIVATION else groups.gradient), False
        return None, self.ctx.device.type == "cuda"

    def knows_shapes(self, transfers: Sequence[Transfer]) -> bool:
        """Whether the shapes of ``transfers``' tensors are known here (``shape`` would not
        wait for them)."""
        return all(t.layer in self._shapes for t in transfers)

    def shape(self, layer: str) -> tuple[torch.dtype, tuple[int, ...]]:
        if layer not in self._shapes:
            dtype, _, dims = self.ctx.store.get(f"shape/{layer}").decode().partition(":")
            self._shapes[layer] = (
                getattr(torch, dtype),
                tuple(int(d) for d in dims.split(",") if d),
            )
        return self._shapes[layer]

    def _publish(self, layer: str, tensor: Tensor, microbatch: int) -> None:
        known = self._shapes.get(layer)
        if known is None:
            dtype = str(tensor.dtype).removeprefix("torch.")
            self.ctx.store.set(f"shape/{layer}", f"{dtype}:{','.join(map(str, tensor.shape))}")
            self._shapes[layer] = (tensor.dtype, tuple(tensor.shape))
        elif known != (tensor.dtype, tuple(tensor.shape)):
            raise EngineError(
                f"layer {layer!r} returned a {tensor.dtype} tensor of shape "
                f"{tuple(tensor.shape)} for micro-batch {microbatch}, but "
                f"{known[0]} {known[1]} before: boundary tensors must keep "
                "their shape"
            )

    def post(self, direction: str, transfer: Transfer, microbatch: int) -> Pending:
        """Post the receive of ``transfer``'s activation or gradient for ``microbatch``."""
        peer_stage = transfer.src_stage if direction == ACTIVATION else transfer.dst_stage
        peer = self.layout.rank_for(peer_stage, microbatch)
        dtype, shape = self.shape(transfer.layer)
        group, staged = self._route(peer, direction)
        device = torch.device("cpu") if staged else self.ctx.device
        buffer = torch.empty(shape, dtype=dtype, device=device, pin_memory=staged)
        work = irecv(buffer, peer, self._tag(direction, transfer, microbatch), group)
        what = (
            f"receiving the {direction} of {transfer.layer!r} for micro-batch "
            f"{microbatch} from {self.layout.describe(peer)}"
        )
        return Pending(work, buffer, peer, what)

    @staticmethod
    def arrived(pending: Sequence[Pending]) -> bool:
        """Whether every one of these receives has completed (``wait`` would not block)."""
        return all(p.work.is_completed() for p in pending)

    def wait(self, pending: Pending) -> Tensor:
        self.watchdog.doing(pending.what, waiting_on=pending.peer)
        try:
            pending.work.wait(self.timeout)
        except Exception as exc:
            raise self.watchdog.failure(pending.what, pending.peer, exc) from exc
        # from pinned memory the copy to the GPU is asynchronous (the host allocator keeps
        # the buffer until it has ended)
        return pending.buffer.to(self.ctx.device, non_blocking=True)

    def send(
        self, direction: str, transfer: Transfer, microbatch: int, tensor: Tensor, step: int
    ) -> None:
        peer_stage = transfer.dst_stage if direction == ACTIVATION else transfer.src_stage
        peer = self.layout.rank_for(peer_stage, microbatch)
        if direction == ACTIVATION:
            self._publish(transfer.layer, tensor, microbatch)
        group, staged = self._route(peer, direction)
        if staged:  # through pinned host memory: a fast copy out, then gloo
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            buffer.copy_(tensor.detach())
        else:
            buffer = tensor.detach().contiguous()
        record = self.recorder.start(
            f"send_{direction}",
            microbatch,
            step,
            peer_stage=peer_stage,
            peer_replica=self.layout.worker(peer)[1],
            bytes=buffer.numel() * buffer.element_size(),
        )
        work = isend(buffer, peer, self._tag(direction, transfer, microbatch), group)
        self._sends.append(_Send(work, buffer, record, peer))

    def reap(self) -> None:
        """Note the sends that have completed (their end time is when this sees them)."""
        waiting = []
        for send in self._sends:
            if send.work.is_completed():
                send.record.end = self.ctx.clock.now_ms()
            else:
                waiting.append(send)
        self._sends = waiting

    def drain(self) -> None:
        """Wait for every send still in flight."""
        for send in self._sends:
            what = (
                f"sending the {send.record.op.removeprefix('send_')} of micro-batch "
                f"{send.record.microbatch} to {self.layout.describe(send.peer)}"
            )
            self.watchdog.doing(what, waiting_on=send.peer)
            try:
                send.work.wait(self.timeout)
            except Exception as exc:
                raise self.watchdog.failure(what, send.peer, exc) from exc
            send.record.end = self.ctx.clock.now_ms()
        self._sends = []
