"""Layer state on the wire: what a migration sends between two ranks, and how.

Two kinds of message go from a layer's old stage to its new one (``transition.py``):

- a *version*: the layer's parameters after a given number of micro-batches' gradients
  were applied (``pipedream`` only: a weight version that a forward on the new stage runs
  on but that the old stage's last updates made);
- the *hand-off*: everything the new owner needs to train the layer on, as two messages:
  the *weights* (parameters and buffers), which its first forward there waits for, then
  the *training state* (gradients accumulated so far, optimizer state), which only its
  first update there waits for, so that most of the bytes travel off the critical path.

A message is a nested dict of tensors and plain values, sent raw, without pickling: every
tensor's bytes are packed into one flat ``uint8`` *payload*, each at a 64-byte-aligned
offset so that the receiver's tensors are views of it, and a small JSON *header* names each
tensor's path, dtype, shape and offset, the plain values and the payload's size. The
payload goes by ``isend``/``irecv`` on the default (gloo) group with a tag above the
transport's (``2**30 + migration * 1024 + slot``); the header goes through the job's store.

Gloo moves a message's bytes only once both ends have posted it, so the receiver posts the
payload's receive as soon as its header is in the store: it ``expect``\\ s its messages as
soon as it learns of the migration, and the worker calls ``progress`` between ops, which
checks the store for their headers. The bytes then travel (gloo's own threads) while both
ranks compute, and the sender's only work is one copy into the payload, which is also what
freezes a version that training goes on to change. Sends are waited for when the run ends.
"""

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.faults import Watchdog

_TAG_BASE = 2 ** 30
_SLOTS = 1024
_ALIGN_BYTES = 64
WEIGHTS_SLOT = 0
TRAINING_SLOT = _SLOTS - 1  # versions use the slots between


def tag(migration_id: int, slot: int) -> int:
    assert 0 <= slot < _SLOTS, slot
    return _TAG_BASE + migration_id * _SLOTS + slot


def layer_versions(modules: Mapping[str, nn.Module]) -> dict[str, dict[str, Tensor]]:
    """The layers' live parameters (a version message)."""
    return {layer: {name: param.detach() for name, param in module.named_parameters()}
            for layer, module in modules.items()}


def layer_weights(modules: Mapping[str, nn.Module]) -> dict[str, dict[str, Any]]:
    """The layers' parameters and buffers (the hand-off's first message)."""
    return {layer: {"params": {name: p.detach() for name, p in module.named_parameters()},
                    "buffers": dict(module.named_buffers())}
            for layer, module in modules.items()}


def layer_training(modules: Mapping[str, nn.Module], optimizer: torch.optim.Optimizer | None
                   ) -> dict[str, dict[str, Any]]:
    """The layers' accumulated gradients and optimizer state (the hand-off's second)."""
    state = optimizer.state if optimizer is not None else {}
    result = {}
    for layer, module in modules.items():
        params = dict(module.named_parameters())
        result[layer] = {
            "grads": {name: p.grad for name, p in params.items() if p.grad is not None},
            "optimizer": {name: dict(state[p]) for name, p in params.items() if state.get(p)},
        }
    return result


@torch.no_grad()
def load_layer_weights(modules: Mapping[str, nn.Module], message: Mapping[str, Any]) -> None:
    for layer, module in modules.items():
        for name, param in module.named_parameters():
            param.copy_(message[layer]["params"][name])
        for name, buffer in module.named_buffers():
            buffer.copy_(message[layer]["buffers"][name])


@torch.no_grad()
def load_layer_training(modules: Mapping[str, nn.Module], message: Mapping[str, Any],
                        device: torch.device) -> dict[nn.Parameter, dict[str, Any]]:
    """Add the gradients into ``modules``; the optimizer state by parameter, on ``device``."""
    optimizer_state: dict[nn.Parameter, dict[str, Any]] = {}
    for layer, module in modules.items():
        entry = message[layer]
        for name, param in module.named_parameters():
            grad = entry["grads"].get(name)
            if grad is not None:  # added to a gradient computed here before it arrived
                grad = grad.to(device)
                param.grad = grad if param.grad is None else param.grad + grad
            if name in entry["optimizer"]:
                optimizer_state[param] = {
                    key: value.to(device) if torch.is_tensor(value) and value.dim() > 0
                    else value for key, value in entry["optimizer"][name].items()}
    return optimizer_state


def _leaves(tree: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(tree, Mapping) and tree:
        for key, value in tree.items():
            yield from _leaves(value, (*path, str(key)))
    else:
        yield path, tree


def _view(payload: Tensor, entry: Mapping[str, Any]) -> Tensor:
    dtype = getattr(torch, entry["dtype"])
    num_bytes = math.prod(entry["shape"]) * dtype.itemsize
    offset = entry["offset"]
    return payload[offset:offset + num_bytes].view(dtype).view(entry["shape"])


def pack(message: Any) -> tuple[dict[str, Any], Tensor]:
    """(header, payload) of a message (module docstring); the tensors are copied once."""
    tensors: list[tuple[dict[str, Any], Tensor]] = []
    values: list[dict[str, Any]] = []
    offset = 0
    for path, leaf in _leaves(message):
        if torch.is_tensor(leaf):
            entry = {"path": path, "dtype": str(leaf.dtype).removeprefix("torch."),
                     "shape": list(leaf.shape), "offset": offset}
            tensors.append((entry, leaf))
            offset += -(-leaf.numel() * leaf.element_size() // _ALIGN_BYTES) * _ALIGN_BYTES
        else:
            values.append({"path": path, "value": leaf})
    payload = torch.empty(offset, dtype=torch.uint8)
    with torch.no_grad():
        for entry, leaf in tensors:
            _view(payload, entry).copy_(leaf)
    header = {"tensors": [entry for entry, _ in tensors], "values": values,
              "num_bytes": offset}
    return header, payload


def unpack(header: Mapping[str, Any], payload: Tensor) -> dict[str, Any]:
    """The message of ``pack``'s (header, payload); its tensors are views of ``payload``."""
    result: dict[str, Any] = {}
    leaves = [(e["path"], _view(payload, e)) for e in header["tensors"]]
    for path, leaf in leaves + [(v["path"], v["value"]) for v in header["values"]]:
        node = result
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = leaf
    return result


@dataclass
class _Incoming:
    """A message this rank expects: its header's store key, then its posted receive."""

    peer: int
    tag: int
    key: str
    header: dict[str, Any] | None = None
    payload: Tensor | None = None
    work: dist.Work | None = None


class Channel:
    """Sends and receives migration messages of one rank (module docstring)."""

    def __init__(self, store: Any, rank: int, timeout_s: float, watchdog: Watchdog) -> None:
        self.store, self.rank = store, rank
        self.timeout = timedelta(seconds=timeout_s)
        self.watchdog = watchdog
        self._sends: list[tuple[dist.Work, Tensor]] = []
        self._incoming: dict[str, _Incoming] = {}
        self.sent_bytes = 0
        self.received_bytes = 0

    def _key(self, message_tag: int, src: int, dst: int) -> str:
        return f"migration/{message_tag}/{src}-{dst}"

    def send(self, message: Any, peer: int, message_tag: int) -> int:
        """Pack ``message``, start sending its payload and publish its header."""
        header, payload = pack(message)
        try:
            text = json.dumps(header)
        except TypeError as exc:
            raise EngineError(f"migration message {message_tag}: {exc}") from exc
        if payload.numel():
            self._sends.append((dist.isend(payload, peer, tag=message_tag), payload))
        self.store.set(self._key(message_tag, self.rank, peer), text)
        self.sent_bytes += payload.numel()
        return payload.numel()

    def expect(self, peer: int, message_tag: int) -> None:
        """Note a message to come, so that ``progress`` posts its receive early."""
        key = self._key(message_tag, peer, self.rank)
        self._incoming.setdefault(key, _Incoming(peer, message_tag, key))

    def _post(self, incoming: _Incoming) -> None:
        incoming.header = json.loads(self.store.get(incoming.key).decode())
        self.store.delete_key(incoming.key)
        incoming.payload = torch.empty(incoming.header["num_bytes"], dtype=torch.uint8)
        if incoming.payload.numel():
            incoming.work = dist.irecv(incoming.payload, incoming.peer, tag=incoming.tag)

    def progress(self) -> None:
        """Post the receive of every expected message whose header has come; a peer sends
        in the order they were expected, so one store lookup per peer tells what is new."""
        behind: set[int] = set()
        for incoming in self._incoming.values():
            if incoming.header is not None or incoming.peer in behind:
                continue
            if self.store.check([incoming.key]):
                self._post(incoming)
            else:
                behind.add(incoming.peer)

    def _wait(self, work: dist.Work, what: str, peer: int | None) -> None:
        self.watchdog.doing(what, waiting_on=peer)
        try:
            work.wait(self.timeout)
        except Exception as exc:
            raise self.watchdog.failure(what, peer, exc) from exc

    def receive(self, peer: int, message_tag: int, what: str) -> dict[str, Any]:
        """The message from ``peer`` with ``message_tag`` (waiting for it if need be)."""
        self.expect(peer, message_tag)
        incoming = self._incoming.pop(self._key(message_tag, peer, self.rank))
        if incoming.header is None:
            self.watchdog.doing(what, waiting_on=peer)
            try:
                self.store.wait([incoming.key], self.timeout)
            except Exception as exc:
                raise self.watchdog.failure(what, peer, exc) from exc
            self._post(incoming)
        if incoming.work is not None:
            self._wait(incoming.work, what, peer)
        assert incoming.header is not None and incoming.payload is not None
        self.received_bytes += incoming.payload.numel()
        return unpack(incoming.header, incoming.payload)

    def drain(self) -> None:
        """Wait for every message this rank sent (its peers have received them)."""
        for work, _ in self._sends:
            self._wait(work, "sending migration state", None)
        self._sends = []
