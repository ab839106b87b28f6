"""The arithmetic a plan trains in (``Plan.precision``), as torch runs it.

- ``fp32``: float32 throughout; on CUDA, matmuls and convolutions without TF32.
- ``tf32``: float32 weights and activations, CUDA matmuls and convolutions in TF32 (the
  CPU has no TF32: there it is fp32).
- ``bf16`` and ``fp16``: ``torch.autocast`` over float32 weights, gradients and optimizer
  state (the master weights): the ops autocast lists run in 16 bits, the rest in 32, and
  activations between layers and stages are what the ops made.

The profiler and the engine hold ``matmuls(precision)`` while they work and run every
forward pass (a recompute too) inside ``forwards(precision, device)``, so profile and run
do the same arithmetic; backward passes follow the dtypes their forward made.
"""

import contextlib
from collections.abc import Iterator

import torch

from pipestudio.planner.formats.documents import PRECISIONS

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The 16-bit dtype autocast runs in for ``precision``; None for fp32 and tf32."""
    if precision not in PRECISIONS:
        raise ValueError(
            f"precision {precision!r} is unknown; expected one of {', '.join(PRECISIONS)}"
        )
    return _AUTOCAST.get(precision)


@contextlib.contextmanager
def matmuls(precision: str) -> Iterator[None]:
    """CUDA matmuls and convolutions in TF32 for ``tf32`` only, forward and backward, for
    as long as the context holds (the flags are the process's)."""
    autocast_dtype(precision)  # a known precision
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


def forwards(precision: str, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """Autocast for ``bf16`` and ``fp16`` forward passes on ``device``; else nothing."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
