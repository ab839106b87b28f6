"""Layer state on the wire: what a migration sends between two ranks, and how.

Two kinds of message go from a layer's old stage to its new one (``switch.py``):

- a *version*: the layer's parameters after a given number of micro-batches' gradients
  were applied (``pipedream`` only: a weight version that a forward on the new stage runs
  on but that the old stage's last updates made);
- the *hand-off*: everything the new owner needs to train the layer on, as two messages:
  the *weights* (parameters and buffers), which its first forward there waits for, then
  the *training state* (gradients accumulated so far, optimizer state), which only its
  first update there waits for, so that most of the bytes travel off the critical path.

A message is a nested dict of tensors and plain values, sent raw, without pickling and
without packing: a *lead* goes first, then each tensor as it lies in memory, one
``isend``/``irecv`` each on the default (gloo) group, all with the message's tag
(``2**30 + migration * 1024 + slot``; gloo delivers a pair's messages of one tag in the
order they were posted). Nothing goes through the job's store.

Gloo moves a message's bytes only once both ends have posted it, so the receiver must post
early, and to post it must know the message's layout (its tensors' paths, dtypes and
shapes, its plain values). Versions and weights have a *known layout*: every rank holds a
copy of every layer, so the receiver derives their header from its own copy and posts
their receives as soon as it learns of the migration; their lead is 64 bytes (a digest of
the sender's header, checked against the receiver's, and the size of the header of the
message announced to follow). The weights' parameters are received straight into the
receiver's own copy of the layer, which nothing there reads before they are in; buffers
(which a forward on an older version may update meanwhile) and, on a GPU, everything land
in new CPU tensors and are copied in when the weights are taken. The training state's
layout depends on the sender's gradients and optimizer (*described*): its lead is its
JSON header, whose size the weights announced, so its receives are posted as the weights
come in, a step's forwards and backwards before the update needs them.

A hand-off's tensors no longer change on the sender (no partition there trains the layer),
so they go as they are: the sender copies nothing, and its training thread only posts the
sends (bytes move on gloo's threads, or in ``isend`` where the receiver posted first). A
version is copied once when sent, which freezes it while training goes on to change the
parameters. A migration's sends are waited for, and their tensors let go, a step after the
switch (``MigrationExecutor.after_update``), and any left when the run ends.
"""

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.execution.transport import irecv, isend
from pipestudio.runtime.engine.faults import Watchdog

_TAG_BASE = 2**30
_SLOTS = 1024
_PREFIX_BYTES = 64  # int64: digest of the header, size of the announced one's header
WEIGHTS_SLOT = 0
TRAINING_SLOT = _SLOTS - 1  # versions use the slots between


def message_tag_of(migration_id: int, slot: int) -> int:
    """The point-to-point tag of a migration's message in ``slot`` (module docstring)."""
    assert 0 <= slot < _SLOTS, slot
    return _TAG_BASE + migration_id * _SLOTS + slot


def migration_of(message_tag: int) -> int:
    """The migration whose message carries ``message_tag``."""
    return (message_tag - _TAG_BASE) // _SLOTS


def layer_versions(modules: Mapping[str, nn.Module]) -> dict[str, dict[str, Tensor]]:
    """The layers' live parameters (a version message)."""
    return {
        layer: {name: param.detach() for name, param in module.named_parameters()}
        for layer, module in modules.items()
    }


def layer_weights(modules: Mapping[str, nn.Module]) -> dict[str, dict[str, Any]]:
    """The layers' parameters and buffers (the hand-off's first message)."""
    return {
        layer: {
            "params": {name: p.detach() for name, p in module.named_parameters()},
            "buffers": dict(module.named_buffers()),
        }
        for layer, module in modules.items()
    }


def layer_training(
    modules: Mapping[str, nn.Module], optimizer: torch.optim.Optimizer | None
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


def weight_layout(modules: Mapping[str, nn.Module]) -> tuple[dict[str, Any], list[Tensor | None]]:
    """The header of the weights of ``modules`` and where each of its tensors is received:
    the parameters themselves, which nothing on the new stage reads before they are in (a
    forward that runs the layer earlier, on an older version, gets that version's own
    tensors); the buffers into new tensors (``None``: such a forward updates the module's
    own, e.g. a batch norm's statistics), copied in when taken."""
    header, tensors = _layout(layer_weights(modules))
    return header, [
        tensor if entry["path"][1] == "params" else None
        for entry, tensor in zip(header["tensors"], tensors, strict=True)
    ]


@torch.no_grad()
def load_layer_weights(modules: Mapping[str, nn.Module], message: Mapping[str, Any]) -> None:
    """Copy the weights in ``message`` into ``modules`` (nothing where they were received
    in place)."""
    for layer, module in modules.items():
        for group, tensors in (
            ("params", module.named_parameters()),
            ("buffers", module.named_buffers()),
        ):
            for name, tensor in tensors:
                value = message[layer][group][name]
                if value.data_ptr() != tensor.data_ptr() or value.device != tensor.device:
                    tensor.copy_(value)


@torch.no_grad()
def load_layer_training(
    modules: Mapping[str, nn.Module], message: Mapping[str, Any], device: torch.device
) -> dict[nn.Parameter, dict[str, Any]]:
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
                    key: value.to(device) if torch.is_tensor(value) and value.dim() > 0 else value
                    for key, value in entry["optimizer"][name].items()
                }
    return optimizer_state


def _leaves(tree: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(tree, Mapping) and tree:
        for key, value in tree.items():
            yield from _leaves(value, (*path, str(key)))
    else:
        yield path, tree


def _layout(message: Any) -> tuple[dict[str, Any], list[Tensor]]:
    """(header, the tensors in its order) of a message, nothing copied."""
    entries: list[dict[str, Any]] = []
    tensors: list[Tensor] = []
    values: list[dict[str, Any]] = []
    num_bytes = 0
    for path, leaf in _leaves(message):
        if torch.is_tensor(leaf):
            entries.append(
                {
                    "path": list(path),
                    "dtype": str(leaf.dtype).removeprefix("torch."),
                    "shape": list(leaf.shape),
                }
            )
            tensors.append(leaf)
            num_bytes += leaf.numel() * leaf.element_size()
        else:
            values.append({"path": list(path), "value": leaf})
    return {"tensors": entries, "values": values, "num_bytes": num_bytes}, tensors


def header_of(message: Any) -> dict[str, Any]:
    """The header of ``message`` (its tensors' paths, dtypes and shapes; its plain values)."""
    return _layout(message)[0]


def message_from(header: Mapping[str, Any], tensors: list[Tensor]) -> dict[str, Any]:
    """The message of ``header`` with ``tensors`` (in the header's order) at its leaves."""
    result: dict[str, Any] = {}
    leaves = [(e["path"], t) for e, t in zip(header["tensors"], tensors, strict=True)]
    for path, leaf in leaves + [(v["path"], v["value"]) for v in header["values"]]:
        node = result
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = leaf
    return result


def _flat(tensor: Tensor, copy: bool) -> Tensor:
    """A contiguous 1-D CPU tensor of ``tensor``'s bytes: the tensor itself where it is one
    and no ``copy`` is asked for."""
    flat = tensor.detach()
    if flat.device.type != "cpu" or not flat.is_contiguous():
        return flat.to("cpu").contiguous().view(-1)  # a copy already
    return (flat.clone() if copy else flat).view(-1)


def _digest(text: bytes) -> int:
    """Of a header's JSON; both ends build a layer's header in the same order."""
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)


class Outgoing:
    """A message about to be sent (module docstring). ``frozen``: its tensors will not
    change, so they are sent as they are; else each is copied when the message is sent."""

    def __init__(self, message: Any, *, frozen: bool) -> None:
        self.header, self._tensors = _layout(message)
        self.frozen = frozen
        try:
            self.text = json.dumps(self.header).encode()
        except TypeError as exc:
            raise EngineError(f"migration message: {exc}") from exc

    def pieces(self, described: bool, announce: "Outgoing | None") -> list[Tensor]:
        """What goes on the wire: the lead (the header if ``described``, else the 64-byte
        prefix announcing ``announce``), then every tensor that has bytes."""
        if described:
            lead = torch.frombuffer(bytearray(self.text), dtype=torch.uint8)
        else:
            announced = len(announce.text) if announce is not None else 0
            lead = torch.zeros(_PREFIX_BYTES // 8, dtype=torch.int64)
            lead[:2] = torch.tensor([_digest(self.text), announced])
        return [lead] + [_flat(t, copy=not self.frozen) for t in self._tensors if t.numel()]


@dataclass
class _Incoming:
    """A message whose lead's receive is posted; ``header`` (known layout, or once a
    described message's lead is in) and its tensors' receives; ``follow``, the tag of the
    described message its prefix announces."""

    lead: Tensor
    work: dist.Work
    header: dict[str, Any] | None
    described: bool = False
    tensors: list[Tensor] = field(default_factory=list)
    works: list[dist.Work] = field(default_factory=list)
    follow: int | None = None


class Channel:
    """Sends and receives migration messages of one rank (module docstring)."""

    def __init__(self, rank: int, timeout_s: float, watchdog: Watchdog) -> None:
        self.rank = rank
        self.timeout = timedelta(seconds=timeout_s)
        self.watchdog = watchdog
        self._sends: list[tuple[int, dist.Work, Tensor]] = []  # (tag, work, what it sends)
        self._incoming: dict[tuple[int, int], _Incoming] = {}
        self.sent_bytes = 0
        self.received_bytes = 0

    def send(
        self,
        message: Outgoing,
        peer: int,
        message_tag: int,
        *,
        described: bool = False,
        announce: Outgoing | None = None,
    ) -> int:
        """Start sending ``message``; a known-layout message may ``announce`` the described
        one that follows it to the same peer. Returns the bytes sent."""
        num_bytes = 0
        for piece in message.pieces(described, announce):
            self._sends.append((message_tag, isend(piece, peer, message_tag), piece))
            num_bytes += piece.numel() * piece.element_size()
        self.sent_bytes += num_bytes
        return num_bytes

    def expect(
        self,
        peer: int,
        message_tag: int,
        header: dict[str, Any],
        into: list[Tensor | None] | None = None,
        follow: int | None = None,
    ) -> None:
        """Post the receives of a message with a known layout (``header``, derived here),
        its tensors straight into ``into`` where they fit (CPU, contiguous, same dtype and
        shape; else into new ones); ``follow``: the tag of the described message it
        announces."""
        if (peer, message_tag) in self._incoming:
            return
        lead = torch.empty(_PREFIX_BYTES // 8, dtype=torch.int64)
        incoming = _Incoming(lead, irecv(lead, peer, message_tag), header, follow=follow)
        self._post_tensors(incoming, peer, message_tag, into)
        self._incoming[(peer, message_tag)] = incoming

    def _post_tensors(
        self, incoming: _Incoming, peer: int, message_tag: int, into: list[Tensor | None] | None
    ) -> None:
        assert incoming.header is not None
        entries = incoming.header["tensors"]
        for entry, target in zip(entries, into or [None] * len(entries), strict=True):
            dtype = getattr(torch, entry["dtype"])
            if (
                target is None
                or target.device.type != "cpu"
                or not target.is_contiguous()
                or target.dtype != dtype
                or list(target.shape) != entry["shape"]
            ):
                target = torch.empty(entry["shape"], dtype=dtype)
            target = target.detach()
            incoming.tensors.append(target)
            if target.numel():
                incoming.works.append(irecv(target.view(-1), peer, message_tag))

    def _wait(self, work: dist.Work, what: str, peer: int | None) -> None:
        self.watchdog.doing(what, waiting_on=peer)
        try:
            work.wait(self.timeout)
        except Exception as exc:
            raise self.watchdog.failure(what, peer, exc) from exc

    def _read_header(self, incoming: _Incoming, peer: int, message_tag: int, what: str) -> None:
        """A described message: wait for its header, then post its tensors' receives."""
        self._wait(incoming.work, what, peer)
        incoming.header = json.loads(bytes(incoming.lead.numpy()).decode())
        self._post_tensors(incoming, peer, message_tag, None)

    def receive(self, peer: int, message_tag: int, what: str) -> dict[str, Any]:
        """The message from ``peer`` with ``message_tag`` (waiting for it if need be); it
        must have been expected, or announced by one received before."""
        incoming = self._incoming.pop((peer, message_tag), None)
        if incoming is None:
            raise EngineError(f"{what}: message {message_tag} was neither expected nor announced")
        if incoming.described:
            if incoming.header is None:
                self._read_header(incoming, peer, message_tag, what)
        else:
            self._wait(incoming.work, what, peer)
            header = incoming.header
            assert header is not None, "a message of a known layout is expected with it"
            digest, header_bytes = incoming.lead[:2].tolist()
            if digest != _digest(json.dumps(header).encode()):
                raise EngineError(
                    f"{what}: the sender's layout of these layers differs from "
                    f"this rank's copy ({header['num_bytes']} bytes "
                    "here)"
                )
            if incoming.follow is not None:  # its header comes right behind these tensors
                lead = torch.empty(header_bytes, dtype=torch.uint8)
                follow = _Incoming(lead, irecv(lead, peer, incoming.follow), None, described=True)
                self._incoming[(peer, incoming.follow)] = follow
        for work in incoming.works:
            self._wait(work, what, peer)
        assert incoming.header is not None
        self.received_bytes += (
            incoming.lead.numel() * incoming.lead.element_size() + incoming.header["num_bytes"]
        )
        if incoming.follow is not None:  # post the training state's tensors now
            follow = self._incoming[(peer, incoming.follow)]
            self._read_header(follow, peer, incoming.follow, what)
        return message_from(incoming.header, incoming.tensors)

    def release(self, migration_id: int) -> None:
        """Wait for the messages this rank sent for ``migration_id`` and let go of their
        tensors (a handed-off layer's optimizer state, copied versions). Gloo's send of a
        message ends only once its receive is posted: call this when every peer must have
        posted them."""
        others = []
        for sent in self._sends:
            if migration_of(sent[0]) == migration_id:
                self._wait(sent[1], f"sending the state of migration {migration_id}", None)
            else:
                others.append(sent)
        self._sends = others

    def drain(self) -> None:
        """Wait for every message this rank sent (its peers have received them)."""
        for _, work, _ in self._sends:
            self._wait(work, "sending migration state", None)
        self._sends = []
