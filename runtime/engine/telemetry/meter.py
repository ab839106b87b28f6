"""Per-layer measurements in a running job, for the online planner.

The engine times ops per stage (``metrics.py``); the planner needs layers. A forward hook
on every layer times each layer's forward while the worker runs a stage's forward (the
meter is armed only then, so recomputation inside a backward is not counted twice) and
notes its output and parameter bytes. The backward of a stage runs as one autograd call,
so a layer's backward time is its forward time scaled by its stage's measured
backward/forward ratio, and the stage's update time is shared by parameter bytes
(``observe.observed_profile``). On CUDA the hook synchronises the device to time a layer,
so the meter is made only when the online planner runs.
"""

import time
from typing import Any

import torch
from torch import Tensor, nn


class LayerMeter:
    """Forward time (sum and count) and sizes of the layers run by one worker."""

    def __init__(self, layers: list[tuple[str, nn.Module]]) -> None:
        self.armed = False
        self.fwd_ms: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.output_bytes: dict[str, int] = {}
        self.param_bytes = {
            name: sum(p.numel() * p.element_size() for p in module.parameters())
            for name, module in layers
        }
        self._started: dict[str, float] = {}
        for name, module in layers:
            module.register_forward_pre_hook(self._pre(name))
            module.register_forward_hook(self._post(name))

    def arm(self, armed: bool) -> None:
        self.armed = armed

    def _sync(self, tensor: Any) -> None:
        if isinstance(tensor, Tensor) and tensor.is_cuda:
            torch.cuda.synchronize(tensor.device)

    def _pre(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            if self.armed:
                if args:
                    self._sync(args[0])
                self._started[name] = time.perf_counter()

        return hook

    def _post(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if not self.armed or name not in self._started:
                return
            self._sync(output)
            elapsed_ms = (time.perf_counter() - self._started.pop(name)) * 1e3
            self.fwd_ms[name] = self.fwd_ms.get(name, 0.0) + elapsed_ms
            self.calls[name] = self.calls.get(name, 0) + 1
            if isinstance(output, Tensor):
                self.output_bytes[name] = output.numel() * output.element_size()

        return hook

    def take(self) -> dict[str, dict[str, float]]:
        """Mean forward ms and sizes per layer since the last call; resets the sums."""
        result = {
            name: {
                "fwd_ms": self.fwd_ms[name] / self.calls[name],
                "calls": self.calls[name],
                "output_bytes": self.output_bytes.get(name, 0),
                "param_bytes": self.param_bytes[name],
            }
            for name in self.calls
        }
        self.fwd_ms, self.calls = {}, {}
        return result
