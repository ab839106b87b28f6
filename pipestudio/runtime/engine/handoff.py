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
offset so that the receiver's tensors are views of it, and a *header* names each tensor's
path, dtype, shape and offset, the plain values and the payload's size. Each message is one
``isend``/``irecv`` on the default (gloo) group with a tag above the transport's
(``2**30 + migration * 1024 + slot``); nothing goes through the job's store.

Gloo moves a message's bytes only once both ends have posted it, so the receiver must post
early, and to post it must know the message's size. Versions and weights have a *known
layout*: every rank holds a copy of every layer, so the receiver derives their header from
its own copy and posts their receives as soon as it learns of the migration. Their body is
a 64-byte prefix (a digest of the sender's header, checked against the receiver's, and the
sizes of the message announced to follow) and the payload. The training state's layout
depends on the sender's gradients and optimizer (*described*): its body is its JSON header,
padded to 64 bytes, and the payload, and the weights message before it announces its sizes,
so its receive is posted the moment the weights are taken, a step's forwards and backwards
before the update needs it. The bytes travel on gloo's own threads while both ranks
compute; the sender's only work is one copy into the payload, which is also what freezes a
version that training goes on to change. Sends are waited for when the run ends.
"""

import hashlib
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
_PREFIX_BYTES = 64  # int64: digest of the header, sizes of the announced message
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


def _aligned(num_bytes: int) -> int:
    return -(-num_bytes // _ALIGN_BYTES) * _ALIGN_BYTES


def _layout(message: Any) -> tuple[dict[str, Any], list[Tensor]]:
    """(header, the tensors in its order) of a message, nothing copied."""
    entries: list[dict[str, Any]] = []
    tensors: list[Tensor] = []
    values: list[dict[str, Any]] = []
    offset = 0
    for path, leaf in _leaves(message):
        if torch.is_tensor(leaf):
            entries.append({"path": list(path), "dtype": str(leaf.dtype).removeprefix("torch."),
                            "shape": list(leaf.shape), "offset": offset})
            tensors.append(leaf)
            offset += _aligned(leaf.numel() * leaf.element_size())
        else:
            values.append({"path": list(path), "value": leaf})
    return {"tensors": entries, "values": values, "num_bytes": offset}, tensors


def describe(message: Any) -> dict[str, Any]:
    """The header ``pack`` gives ``message``, without copying its tensors."""
    return _layout(message)[0]


@torch.no_grad()
def _fill(payload: Tensor, header: Mapping[str, Any], tensors: list[Tensor]) -> None:
    for entry, leaf in zip(header["tensors"], tensors, strict=True):
        _view(payload, entry).copy_(leaf)


def pack(message: Any) -> tuple[dict[str, Any], Tensor]:
    """(header, payload) of a message (module docstring); the tensors are copied once."""
    header, tensors = _layout(message)
    payload = torch.empty(header["num_bytes"], dtype=torch.uint8)
    _fill(payload, header, tensors)
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


def _digest(text: bytes) -> int:
    """Of a header's JSON; both ends build a layer's header in the same order."""
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)


class Outgoing:
    """A message about to be sent: its header now, its bytes copied when it is sent."""

    def __init__(self, message: Any) -> None:
        self.header, self._tensors = _layout(message)
        try:
            self.text = json.dumps(self.header).encode()
        except TypeError as exc:
            raise EngineError(f"migration message: {exc}") from exc

    @property
    def described_bytes(self) -> tuple[int, int]:
        """(header bytes, body bytes) of this message sent with its header."""
        return len(self.text), _aligned(len(self.text)) + self.header["num_bytes"]

    def body(self, described: bool, announce: "Outgoing | None") -> Tensor:
        """The bytes on the wire: the header (``described``) or the prefix, then the payload."""
        if described:
            lead = torch.frombuffer(bytearray(self.text), dtype=torch.uint8)
            start = _aligned(len(self.text))
        else:
            sizes = announce.described_bytes if announce is not None else (0, 0)
            lead = torch.tensor([_digest(self.text), *sizes], dtype=torch.int64).view(torch.uint8)
            start = _PREFIX_BYTES
        body = torch.empty(start + self.header["num_bytes"], dtype=torch.uint8)
        body[:lead.numel()] = lead
        _fill(body[start:], self.header, self._tensors)
        return body


@dataclass
class _Incoming:
    """A message whose receive is posted: ``header`` when its layout is known here, else
    the size of the header at the start of its body; ``follow``, the tag of the described
    message its prefix announces."""

    body: Tensor
    work: dist.Work
    header: dict[str, Any] | None
    header_bytes: int = 0
    follow: int | None = None


class Channel:
    """Sends and receives migration messages of one rank (module docstring)."""

    def __init__(self, rank: int, timeout_s: float, watchdog: Watchdog) -> None:
        self.rank = rank
        self.timeout = timedelta(seconds=timeout_s)
        self.watchdog = watchdog
        self._sends: list[tuple[dist.Work, Tensor]] = []
        self._incoming: dict[tuple[int, int], _Incoming] = {}
        self.sent_bytes = 0
        self.received_bytes = 0

    def send(self, message: Outgoing, peer: int, message_tag: int, *, described: bool = False,
             announce: Outgoing | None = None) -> int:
        """Copy ``message`` into its body and start sending it; a known-layout message may
        ``announce`` the described one that follows it to the same peer. Returns bytes."""
        body = message.body(described, announce)
        self._sends.append((dist.isend(body, peer, tag=message_tag), body))
        self.sent_bytes += body.numel()
        return body.numel()

    def expect(self, peer: int, message_tag: int, header: dict[str, Any],
               follow: int | None = None) -> None:
        """Post the receive of a message with a known layout (``header``, derived here);
        ``follow``: the tag of the described message it announces."""
        if (peer, message_tag) not in self._incoming:
            self._post(peer, message_tag, _PREFIX_BYTES + header["num_bytes"], header,
                       follow=follow)

    def _post(self, peer: int, message_tag: int, num_bytes: int, header: dict[str, Any] | None,
              header_bytes: int = 0, follow: int | None = None) -> None:
        body = torch.empty(num_bytes, dtype=torch.uint8)
        work = dist.irecv(body, peer, tag=message_tag)
        self._incoming[(peer, message_tag)] = _Incoming(body, work, header, header_bytes, follow)

    def _wait(self, work: dist.Work, what: str, peer: int | None) -> None:
        self.watchdog.doing(what, waiting_on=peer)
        try:
            work.wait(self.timeout)
        except Exception as exc:
            raise self.watchdog.failure(what, peer, exc) from exc

    def receive(self, peer: int, message_tag: int, what: str) -> dict[str, Any]:
        """The message from ``peer`` with ``message_tag`` (waiting for it if need be); it
        must have been expected, or announced by one received before."""
        incoming = self._incoming.pop((peer, message_tag), None)
        if incoming is None:
            raise EngineError(f"{what}: message {message_tag} was neither expected nor "
                              "announced")
        self._wait(incoming.work, what, peer)
        self.received_bytes += incoming.body.numel()
        if incoming.header is None:  # described: the header leads the body
            text = bytes(incoming.body[:incoming.header_bytes].numpy())
            header = json.loads(text.decode())
            return unpack(header, incoming.body[_aligned(incoming.header_bytes):])
        digest, header_bytes, num_bytes = incoming.body[:_PREFIX_BYTES].view(torch.int64)[:3]
        if int(digest) != _digest(json.dumps(incoming.header).encode()):
            raise EngineError(f"{what}: the sender's layout of these layers differs from "
                              f"this rank's copy ({incoming.header['num_bytes']} bytes here)")
        if incoming.follow is not None:
            self._post(peer, incoming.follow, int(num_bytes), None, int(header_bytes))
        return unpack(incoming.header, incoming.body[_PREFIX_BYTES:])

    def drain(self) -> None:
        """Wait for every message this rank sent (its peers have received them)."""
        for work, _ in self._sends:
            self._wait(work, "sending migration state", None)
        self._sends = []
