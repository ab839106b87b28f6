"""Timing a piece of work on a device: the median over repeats, after warm-up runs.

On CUDA, kernels run asynchronously, so a host clock would time only their launch: a pair of
``torch.cuda.Event`` brackets the work on the stream and the host waits for the end event.
On CPU the work is synchronous and ``time.perf_counter`` is exact enough. The median, not
the mean, keeps one run disturbed by the OS or a first-touch allocation from skewing a layer.
"""

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from pipestudio.runtime.devices import synchronize

T = TypeVar("T")


def median_ms(
    run: Callable[[T], object],
    prepare: Callable[[], T],
    device: torch.device,
    *,
    warmup: int,
    repeats: int,
) -> float:
    """Median milliseconds of ``run(prepare())`` over ``repeats`` runs after ``warmup``.

    ``prepare`` is not timed: the backward of a layer needs a fresh forward each time.
    """
    for _ in range(warmup):
        run(prepare())
    times_ms = []
    for _ in range(repeats):
        arg = prepare()
        synchronize(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(arg)
            end.record()
            end.synchronize()
            times_ms.append(start.elapsed_time(end))
        else:
            start_s = time.perf_counter()
            run(arg)
            times_ms.append((time.perf_counter() - start_s) * 1000.0)
    return float(statistics.median(times_ms))


def nothing() -> None:
    """A ``prepare`` for work that needs no fresh input."""
    return None
