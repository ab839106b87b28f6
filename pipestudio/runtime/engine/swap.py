"""The ``swap`` policy: a layer's saved tensors wait in host memory between its forward and
its backward (vPipe §3, DawnPiper §4; Capuchin's swap), moved on a side CUDA stream.

During the forward of a swapped layer, ``saved_tensors_hooks`` hand every tensor autograd
saves (except parameters and buffers, which are static memory) to a ``SwapSpace``. Right
after the stage's forward, ``swap_out`` copies them to pinned host memory on the side
stream and lets the device copies go. The engine knows the op that runs before each
backward (the schedule), so at its start it calls ``swap_in`` for the micro-batch whose
backward comes next: the copies back overlap that op, as the simulator models it. If a
backward unpacks a tensor that was not fetched, it is fetched then.

On CPU nothing moves: the space keeps the accounting (bytes that would move per
micro-batch) and hands autograd its own tensors back, so results are unchanged.
"""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class _Saved:
    """One saved tensor: on the device, on the host, or on its way back."""

    device_tensor: Tensor | None
    host_tensor: Tensor | None = None
    ready: torch.cuda.Event | None = None

    def unpack(self) -> Tensor:
        assert self.device_tensor is not None, "a swapped tensor was unpacked before swap_in"
        if self.ready is not None:
            torch.cuda.current_stream().wait_event(self.ready)
            self.device_tensor.record_stream(torch.cuda.current_stream())
        return self.device_tensor


@dataclass
class _Batch:
    """The saved tensors of one micro-batch and their bytes."""

    saved: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], _Saved] = field(
        default_factory=dict)
    num_bytes: int = 0
    on_host: bool = False


class SwapSpace:
    """Swapped saved tensors of one stage, per micro-batch (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.moves = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.moves else None
        self._batches: dict[int, _Batch] = {}

    @contextlib.contextmanager
    def saving(self, microbatch: int, static: set[int]) -> Iterator[None]:
        """Inside it, tensors autograd saves (storages not in ``static``) go to the space."""
        batch = self._batches.setdefault(microbatch, _Batch())

        def pack(tensor: Tensor) -> object:
            if tensor.untyped_storage().data_ptr() in static or tensor.device != self.device:
                return tensor
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
                   tuple(tensor.shape), tuple(tensor.stride()))
            if key not in batch.saved:
                batch.saved[key] = _Saved(tensor)
                batch.num_bytes += tensor.numel() * tensor.element_size()
            return batch.saved[key]

        def unpack(packed: object) -> Tensor:
            if not isinstance(packed, _Saved):
                return packed  # type: ignore[return-value]
            if packed.device_tensor is None:  # not prefetched: fetch the micro-batch now
                self.swap_in(microbatch)
            return packed.unpack()

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    def num_bytes(self, microbatch: int) -> int:
        batch = self._batches.get(microbatch)
        return 0 if batch is None else batch.num_bytes

    def swap_out(self, microbatch: int) -> tuple[torch.cuda.Event, torch.cuda.Event] | None:
        """Start copying the micro-batch's tensors to the host; CUDA events around the copy."""
        batch = self._batches.get(microbatch)
        if batch is None or not self.moves or batch.on_host:
            return None
        assert self.stream is not None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            start.record()
            for saved in batch.saved.values():
                assert saved.device_tensor is not None
                host = torch.empty(saved.device_tensor.shape, dtype=saved.device_tensor.dtype,
                                   pin_memory=True)
                host.copy_(saved.device_tensor, non_blocking=True)
                saved.device_tensor.record_stream(self.stream)
                saved.host_tensor, saved.device_tensor = host, None
            end.record()
        batch.on_host = True
        return start, end

    def swap_in(self, microbatch: int) -> tuple[torch.cuda.Event, torch.cuda.Event] | None:
        """Start copying the micro-batch's tensors back to the device (a prefetch)."""
        batch = self._batches.get(microbatch)
        if batch is None or not batch.on_host:
            return None
        assert self.stream is not None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            start.record()
            for saved in batch.saved.values():
                assert saved.host_tensor is not None
                saved.device_tensor = saved.host_tensor.to(self.device, non_blocking=True)
                saved.ready = end
            end.record()
        batch.on_host = False
        return start, end

    def release(self, microbatch: int) -> None:
        """The backward is done: forget the micro-batch's tensors."""
        self._batches.pop(microbatch, None)
