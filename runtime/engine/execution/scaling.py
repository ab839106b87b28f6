"""fp16's dynamic loss scaling, one decision for the whole job.

float16 holds nothing below about 6e-8, so small gradients vanish; the last stage
therefore starts each micro-batch's backward from ``scale`` (not 1), every gradient of the
step comes out ``scale`` times too large, and the update divides it out. A scale too large
makes some gradient overflow to infinity or NaN: that step's update is skipped, and the
scale halves. After ``growth_interval`` steps in a row without an overflow it doubles.
This is ``torch.amp.GradScaler``'s rule, with its defaults, so a pipeline skips exactly the
steps that single-process training with a ``GradScaler`` skips.

In a pipeline an overflow shows where it happens: in one stage's weight gradients, or one
replica's. Before each update every rank checks its own gradients and the ranks take the
maximum of their findings over the job's default process group (one float, with the run's
timeout), so a step skipped by one rank is skipped by all, and every rank keeps the same
scale. Because the state is the same everywhere, a live migration has nothing to move for
it; a checkpoint stores it with each rank's state (``checkpoint.py``).

Only the flushing schedules (``gpipe``, ``1f1b``) scale: ``pipedream`` updates each stage
after every micro-batch, at different times on different stages, so there is no step
to agree on; ``EngineConfig.check`` refuses that combination.
"""

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipestudio.runtime.engine.faults import Watchdog

#: GradScaler's defaults.
INIT_SCALE = 2.0**16
GROWTH_INTERVAL = 2000


@dataclass
class LossScaler:
    """The scale and its bookkeeping (module docstring)."""

    scale: float = INIT_SCALE
    growth_interval: int = GROWTH_INTERVAL
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    #: Steps since the last overflow or growth.
    tracker: int = 0

    @staticmethod
    def overflowed(params: Iterable[nn.Parameter]) -> bool:
        """Whether any gradient among ``params`` holds an infinity or a NaN."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return False
        flags = torch.stack([torch.logical_not(torch.isfinite(g)).any() for g in grads])
        return bool(flags.any())

    @staticmethod
    def agree(found: bool, timeout_s: float, watchdog: Watchdog, step: int) -> bool:
        """Whether any rank of the job found an overflow (every rank calls this once per
        step, in step order)."""
        what = f"agreeing on the loss scale's overflow check of step {step}"
        flag = torch.tensor([float(found)])
        watchdog.doing(what)
        try:
            work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
            assert work is not None
            work.wait(timedelta(seconds=timeout_s))
        except Exception as exc:
            raise watchdog.failure(what, None, exc) from exc
        return bool(flag.item() > 0)

    def unscale(self, params: Iterable[nn.Parameter]) -> None:
        """Divide the gradients by the scale (a power of two: exact)."""
        inverse = 1.0 / self.scale
        with torch.no_grad():
            for param in params:
                if param.grad is not None:
                    param.grad.mul_(inverse)

    def update(self, overflow: bool) -> None:
        """The scale for the next step (module docstring)."""
        if overflow:
            self.scale *= self.backoff_factor
            self.tracker = 0
            return
        self.tracker += 1
        if self.tracker == self.growth_interval:
            self.scale *= self.growth_factor
            self.tracker = 0

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, type(getattr(self, key))(value))
