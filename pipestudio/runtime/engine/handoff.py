"""Layer state on the wire: what a migration sends between two ranks, and how.

Two kinds of message go from a layer's old stage to its new one (``transition.py``):

- a *version*: the layer's parameters after a given number of micro-batches' gradients
  were applied (``pipedream`` only: a weight version that a forward on the new stage runs
  on but that the old stage's last updates made);
- the *hand-off*: everything the new owner needs to train the layer on: parameters,
  buffers, the gradients accumulated so far and the optimizer state.

A message is the ``torch.save`` of a dict of CPU tensors, sent as its length (one int64)
then its bytes, by ``isend``/``irecv`` on the default (gloo) group, with tags above the
transport's (``2**30 + (migration * 1024 + slot) * 2``). Sends are not waited for until
the transition ends, so the sender goes on computing while the bytes travel.
"""

import io
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from pipestudio.runtime.engine.faults import Watchdog

_TAG_BASE = 2 ** 30
HANDOFF_SLOT = 0


def tag(migration_id: int, slot: int) -> int:
    return _TAG_BASE + (migration_id * 1024 + slot) * 2


def _cpu(value: Any) -> Any:
    """``torch.save`` copies the bytes at once, so no copy is made here."""
    return value.detach().to("cpu") if torch.is_tensor(value) else value


def layer_versions(modules: Mapping[str, nn.Module]) -> dict[str, dict[str, Tensor]]:
    """The layers' live parameters (a version message)."""
    return {layer: {name: _cpu(param) for name, param in module.named_parameters()}
            for layer, module in modules.items()}


def layer_state(modules: Mapping[str, nn.Module], optimizer: torch.optim.Optimizer | None
                ) -> dict[str, dict[str, Any]]:
    """The layers' parameters, buffers, gradients and optimizer state (the hand-off)."""
    result = {}
    for layer, module in modules.items():
        params = dict(module.named_parameters())
        state = optimizer.state if optimizer is not None else {}
        result[layer] = {
            "params": {name: _cpu(p) for name, p in params.items()},
            "buffers": {name: _cpu(b) for name, b in module.named_buffers()},
            "grads": {name: _cpu(p.grad) for name, p in params.items() if p.grad is not None},
            "optimizer": {name: {key: _cpu(value) for key, value in state[p].items()}
                          for name, p in params.items() if state.get(p)},
        }
    return result


@torch.no_grad()
def load_layer_state(modules: Mapping[str, nn.Module], state: Mapping[str, Any],
                     device: torch.device) -> dict[nn.Parameter, dict[str, Any]]:
    """Load a hand-off into ``modules``; the optimizer state by parameter, on ``device``."""
    optimizer_state: dict[nn.Parameter, dict[str, Any]] = {}
    for layer, module in modules.items():
        entry = state[layer]
        params = dict(module.named_parameters())
        for name, param in params.items():
            param.copy_(entry["params"][name])
            grad = entry["grads"].get(name)
            if grad is not None:  # added to a gradient computed here before it arrived
                grad = grad.to(device)
                param.grad = grad if param.grad is None else param.grad + grad
            if name in entry["optimizer"]:
                optimizer_state[param] = {
                    key: value.to(device) if torch.is_tensor(value) and value.dim() > 0
                    else value for key, value in entry["optimizer"][name].items()}
        for name, buffer in module.named_buffers():
            buffer.copy_(entry["buffers"][name])
    return optimizer_state


class Channel:
    """Sends and receives migration messages of one rank (module docstring)."""

    def __init__(self, timeout_s: float, watchdog: Watchdog) -> None:
        self.timeout = timedelta(seconds=timeout_s)
        self.watchdog = watchdog
        self._sends: list[tuple[dist.Work, Tensor]] = []
        self.sent_bytes = 0
        self.received_bytes = 0

    def send(self, payload: Any, peer: int, message_tag: int) -> int:
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        data = torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8)
        length = torch.tensor([data.numel()], dtype=torch.int64)
        for tensor, offset in ((length, 0), (data, 1)):
            self._sends.append((dist.isend(tensor, peer, tag=message_tag + offset), tensor))
        self.sent_bytes += data.numel()
        return data.numel()

    def _wait(self, work: dist.Work, what: str, peer: int | None) -> None:
        self.watchdog.doing(what, waiting_on=peer)
        try:
            work.wait(self.timeout)
        except Exception as exc:
            raise self.watchdog.failure(what, peer, exc) from exc

    def receive(self, peer: int, message_tag: int, what: str) -> Any:
        length = torch.zeros(1, dtype=torch.int64)
        self._wait(dist.irecv(length, peer, tag=message_tag), what, peer)
        data = torch.empty(int(length.item()), dtype=torch.uint8)
        self._wait(dist.irecv(data, peer, tag=message_tag + 1), what, peer)
        self.received_bytes += data.numel()
        return torch.load(io.BytesIO(memoryview(data.numpy())), weights_only=False)

    def drain(self) -> None:
        """Wait for every message this rank sent (its peers have received them)."""
        for work, _ in self._sends:
            self._wait(work, "sending migration state", None)
        self._sends = []
