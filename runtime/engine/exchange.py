"""Small documents exchanged between ranks as JSON in byte tensors, never as pickles.

torch.distributed's object collectives (``all_gather_object``, ``gather_object``) unpickle
whatever each peer sends, so a process that joined the run's store pretending to be a
rank could run code in every other rank. The engine's own exchanges (where each rank
runs, the timelines gathered at the end) are plain data: they travel as JSON, which a
peer can make wrong but not executable.
"""

import json
from typing import Any

import torch
import torch.distributed as dist


def _encoded(value: Any) -> torch.Tensor:
    return torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8)


def _decoded(chunk: torch.Tensor, size: int) -> Any:
    return json.loads(chunk[:size].numpy().tobytes())


def _sizes_and_padded(data: torch.Tensor, world_size: int) -> tuple[list[int], torch.Tensor]:
    """Every rank's byte count, and this rank's bytes padded to the longest."""
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(sizes, torch.tensor([data.numel()], dtype=torch.int64))
    counts = [int(size.item()) for size in sizes]
    padded = torch.zeros(max(counts), dtype=torch.uint8)
    padded[: data.numel()] = data
    return counts, padded


def all_gather_json(value: Any) -> list[Any]:
    """Every rank's ``value`` (JSON data), in rank order, on every rank."""
    world_size = dist.get_world_size()
    counts, padded = _sizes_and_padded(_encoded(value), world_size)
    chunks = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(chunks, padded)
    return [_decoded(chunk, count) for chunk, count in zip(chunks, counts, strict=True)]


def gather_json(value: Any, dst: int) -> list[Any] | None:
    """Every rank's ``value`` (JSON data), in rank order, on rank ``dst``; None elsewhere."""
    world_size = dist.get_world_size()
    counts, padded = _sizes_and_padded(_encoded(value), world_size)
    here = dist.get_rank() == dst
    chunks = [torch.empty_like(padded) for _ in range(world_size)] if here else None
    dist.gather(padded, chunks, dst=dst)
    if chunks is None:
        return None
    return [_decoded(chunk, count) for chunk, count in zip(chunks, counts, strict=True)]
