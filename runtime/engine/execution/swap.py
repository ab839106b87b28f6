"""The ``swap`` policy: a layer's saved tensors wait in host memory between its forward and
its backward (vPipe §3, DawnPiper §4; Capuchin's swap), moved on a side CUDA stream.

During the forward of a swapped layer, ``saved_tensors_hooks`` hand every tensor autograd
saves to a ``SwapSpace``, except parameters and buffers (static memory) and the layer's
inputs (made by the layer before it, which keeps or swaps them). What moves is storage:
autograd often saves several views of one storage (the query, key and value of attention
cut from one projection, a tensor and its transpose), and each storage is copied once, its
views rebuilt on the way back. The bytes moved are then exactly what the profiler counts as
the layer's ``saved_bytes`` (``activation_memory.py``), which the simulator moves.

Right after the stage's forward, ``swap_out`` copies the micro-batch's storages to pinned
host memory on the side stream and lets the device copies go. The engine knows the op that
runs before each backward (the schedule), so at its start it calls ``swap_in`` for the
micro-batch whose backward comes next: the copies back overlap that op, as the simulator
models it. If a backward unpacks a tensor that was not fetched, it is fetched then.

On CPU nothing moves: the space keeps the accounting (bytes that would move per
micro-batch) and hands autograd its own tensors back, so results are unchanged. With
``rehearse=True`` a CPU space copies the storages out and back as a GPU's would (to plain
memory, with no stream), so that tests check the views it rebuilds against plain training.
"""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class _Storage:
    """One saved storage, as bytes: on the device, on the host, or on its way back."""

    device_bytes: Tensor | None
    host_bytes: Tensor | None = None
    ready: torch.cuda.Event | None = None

    def fetched(self) -> Tensor:
        """The device bytes, once the copy back has ended (for the current stream)."""
        assert self.device_bytes is not None, "a swapped tensor was unpacked before swap_in"
        if self.ready is not None:
            torch.cuda.current_stream().wait_event(self.ready)
            self.device_bytes.record_stream(torch.cuda.current_stream())
            self.ready = None
        return self.device_bytes


@dataclass
class _View:
    """One saved tensor: the tensor itself until its storage moves, then how to rebuild it
    from the storage (dtype, storage offset, shape, strides)."""

    storage: _Storage
    tensor: Tensor | None
    dtype: torch.dtype
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def unpack(self) -> Tensor:
        if self.tensor is not None:
            return self.tensor
        data = self.storage.fetched()
        return torch.empty(0, dtype=self.dtype, device=data.device).set_(
            data.untyped_storage(), self.offset, self.shape, self.stride
        )


@dataclass
class _Batch:
    """The saved storages of one micro-batch, their views and bytes."""

    storages: dict[int, _Storage] = field(default_factory=dict)  # data pointer -> storage
    views: dict[tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype], _View] = field(
        default_factory=dict
    )
    num_bytes: int = 0
    on_host: bool = False


def _as_bytes(tensor: Tensor) -> Tensor:
    """The whole storage underneath ``tensor`` as a flat uint8 tensor (no copy)."""
    storage = tensor.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(
        storage, 0, (storage.nbytes(),), (1,)
    )


class SwapSpace:
    """Swapped saved tensors of one stage, per micro-batch (see the module docstring)."""

    def __init__(self, device: torch.device, *, rehearse: bool = False) -> None:
        self.device = device
        self.on_gpu = device.type == "cuda"
        self.moves = self.on_gpu or rehearse
        self.stream = torch.cuda.Stream(device) if self.on_gpu else None
        self._batches: dict[int, _Batch] = {}

    @contextlib.contextmanager
    def saving(
        self, microbatch: int, static: set[int], inputs: tuple[Tensor, ...] = ()
    ) -> Iterator[None]:
        """Inside it, tensors autograd saves go to the space, except those whose storage is
        in ``static`` or underlies one of the layer's ``inputs``."""
        batch = self._batches.setdefault(microbatch, _Batch())
        stays = static | {t.untyped_storage().data_ptr() for t in inputs}

        def pack(tensor: Tensor) -> object:
            ptr = tensor.untyped_storage().data_ptr()
            if ptr in stays or tensor.device != self.device:
                return tensor
            offset = int(tensor.storage_offset())
            key = (ptr, offset, tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
            view = batch.views.get(key)
            if view is None:
                storage = batch.storages.get(ptr)
                if storage is None:
                    storage = batch.storages[ptr] = _Storage(_as_bytes(tensor))
                    batch.num_bytes += tensor.untyped_storage().nbytes()
                view = batch.views[key] = _View(
                    storage,
                    tensor,
                    tensor.dtype,
                    offset,
                    tuple(tensor.shape),
                    tuple(tensor.stride()),
                )
            return view

        def unpack(packed: object) -> Tensor:
            if not isinstance(packed, _View):
                return packed  # type: ignore[return-value]
            if packed.tensor is None and packed.storage.device_bytes is None:
                self.swap_in(microbatch)  # not prefetched: fetch the micro-batch now
            return packed.unpack()

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    def num_bytes(self, microbatch: int) -> int:
        batch = self._batches.get(microbatch)
        return 0 if batch is None else batch.num_bytes

    def on_host(self, microbatch: int) -> bool:
        batch = self._batches.get(microbatch)
        return batch is not None and batch.on_host

    def _side(self) -> contextlib.AbstractContextManager[object]:
        return (
            torch.cuda.stream(self.stream)
            if self.stream is not None
            else (contextlib.nullcontext())
        )

    def _events(self) -> tuple[torch.cuda.Event, torch.cuda.Event] | None:
        if not self.on_gpu:
            return None
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def swap_out(self, microbatch: int) -> tuple[torch.cuda.Event, torch.cuda.Event] | None:
        """Start copying the micro-batch's storages to the host; CUDA events around the copy
        (None on CPU)."""
        batch = self._batches.get(microbatch)
        if batch is None or not self.moves or batch.on_host:
            return None
        events = self._events()
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with self._side():
            if events is not None:
                events[0].record()
            for storage in batch.storages.values():
                assert storage.device_bytes is not None
                host = torch.empty(
                    storage.device_bytes.shape, dtype=torch.uint8, pin_memory=self.on_gpu
                )
                host.copy_(storage.device_bytes, non_blocking=self.on_gpu)
                if self.stream is not None:
                    storage.device_bytes.record_stream(self.stream)
                storage.host_bytes, storage.device_bytes = host, None
            if events is not None:
                events[1].record()
        for view in batch.views.values():
            view.tensor = None
        batch.on_host = True
        return events

    def swap_in(self, microbatch: int) -> tuple[torch.cuda.Event, torch.cuda.Event] | None:
        """Start copying the micro-batch's storages back to the device (a prefetch)."""
        batch = self._batches.get(microbatch)
        if batch is None or not batch.on_host:
            return None
        events = self._events()
        with self._side():
            if events is not None:
                events[0].record()
            for storage in batch.storages.values():
                assert storage.host_bytes is not None
                storage.device_bytes = storage.host_bytes.to(
                    self.device, copy=True, non_blocking=self.on_gpu
                )
                storage.host_bytes = None
                storage.ready = None if events is None else events[1]
            if events is not None:
                events[1].record()
        batch.on_host = False
        return events

    def release(self, microbatch: int) -> None:
        """The backward is done: forget the micro-batch's tensors."""
        self._batches.pop(microbatch, None)
