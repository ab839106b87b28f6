"""Data parallelism inside a stage: the all-reduce of gradients among its replicas.

Replica ``j`` of a stage runs micro-batches ``j, j + r, j + 2r, ...``; the loss of each is
divided by the number of micro-batches of a step, so the sum of the replicas' gradients is
the gradient of the whole mini-batch (PipeDream §3.2, stage replication). Synchronous
schedules all-reduce once per step after the flush, ``pipedream`` after every round of r
micro-batches (each replica's k-th backward), as the simulator models it.

Gradients are flattened per dtype into one buffer per all-reduce. A parameter that no
micro-batch of a replica used has no gradient there; a second small all-reduce counts, per
parameter, the replicas that have one, so a parameter no replica used keeps no gradient
and the optimizer skips it, as it would in one process.
"""

from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from pipestudio.runtime.engine.faults import Watchdog


def allreduce_gradients(
    params: Mapping[str, nn.Parameter],
    group: dist.ProcessGroup,
    staged: bool,
    timeout_s: float,
    watchdog: Watchdog,
    what: str,
) -> None:
    """Sum ``.grad`` of ``params`` over ``group`` (through host memory when ``staged``)."""
    trainable = [param for param in params.values() if param.requires_grad]
    if not trainable:
        return
    device = torch.device("cpu") if staged else trainable[0].device
    flags = torch.tensor([float(param.grad is not None) for param in trainable], device=device)
    buckets: dict[torch.dtype, list[nn.Parameter]] = {}
    for param in trainable:
        buckets.setdefault(param.dtype, []).append(param)
    flats = {
        dtype: torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(device)
                for p in members
            ]
        )
        for dtype, members in buckets.items()
    }
    watchdog.doing(what)
    try:
        works = [
            dist.all_reduce(tensor, group=group, async_op=True)
            for tensor in (flags, *flats.values())
        ]
        for work in works:
            assert work is not None
            work.wait(timedelta(seconds=timeout_s))
    except Exception as exc:
        raise watchdog.failure(what, None, exc) from exc
    used = dict(zip(map(id, trainable), flags.tolist(), strict=True))
    with torch.no_grad():
        for dtype, members in buckets.items():
            offset = 0
            for param in members:
                chunk = flats[dtype][offset : offset + param.numel()].view_as(param)
                offset += param.numel()
                param.grad = chunk.to(param.device).clone() if used[id(param)] else None
