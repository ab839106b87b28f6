"""Joining the job: the store, the process groups, the device and the shared clock of a rank.

Every rank connects to one ``torch.distributed.TCPStore``: the one the local launcher
bound on port 0 (so no port is ever fixed), or under torchrun the one its environment
names (``MASTER_ADDR``/``MASTER_PORT``; the elastic agent's store when it offers one, else
rank 0's). The default process group is gloo: it carries control, the final gathering of
timelines, and every transfer on CPU. On CUDA each rank takes the GPU
``plan device % local GPUs``; transfers between ranks on different GPUs go over NCCL
(one group for activations and one for gradients, so that the two directions between a pair
of GPUs never wait on each other's order), and between two ranks that share a GPU they are
staged through host memory over gloo, because NCCL cannot connect a GPU to itself. Each
replicated stage gets its own group for the all-reduce of its gradients: NCCL when its
replicas are on different GPUs, gloo otherwise. Every group has the job's timeout.

Before it joins, a rank names the network interface gloo and NCCL use (``network.py``):
the one holding its own address (``StoreAddress.own_address``, the address its worker
advertises), else its address on the route to the store. It leaves that address in the
store with a port it listens on there, and once all have arrived, dials each peer's: a rank
that cannot reach a peer fails within the timeout naming its own address and the peer's.

Before the groups, every rank waits on the store until all ranks have arrived, for
``join_timeout_s`` (the job's timeout, and at least ``JOIN_TIMEOUT_S``): starting a process
that imports torch can take longer than an op may on a loaded machine, and a rank that dies
before it arrives is seen at once by the launcher (or torchrun), not by this wait.
"""

import json
import os
import re
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.exchange import all_gather_json
from pipestudio.runtime.engine.layout import EngineLayout
from pipestudio.runtime.engine.network import (
    Binding,
    bind_interfaces,
    listen,
    unreachable_peers,
)
from pipestudio.runtime.engine.telemetry.clock import Clock

#: The least time ranks wait for each other to start (see the module docstring).
JOIN_TIMEOUT_S = 45.0


@dataclass(frozen=True)
class StoreAddress:
    host: str
    port: int
    is_master: bool = False
    prefix: str = "pipestudio"
    #: The address this rank's peers reach it at (None: its address on the route to the
    #: store); gloo and NCCL bind to the interface that holds it (``network.py``).
    own_address: str | None = None


@dataclass
class Groups:
    """The process groups a rank uses besides the default (gloo) one."""

    activation: dist.ProcessGroup | None = None
    gradient: dist.ProcessGroup | None = None
    replicas: dist.ProcessGroup | None = None
    replicas_on_cpu: bool = True
    nccl_peers: set[int] = field(default_factory=set)


@dataclass
class RankContext:
    """What a rank knows about the job once it has joined."""

    rank: int
    world_size: int
    address: StoreAddress
    store: dist.Store
    device: torch.device
    groups: Groups
    clock: Clock
    placement: list[tuple[str, str]]
    timeout_s: float


def address_from_env() -> StoreAddress:
    """The store torchrun's environment names (see the module docstring)."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    try:
        return StoreAddress(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=not agent and os.environ["RANK"] == "0",
            prefix=f"pipestudio/{restart}",
        )
    except KeyError as exc:
        raise EngineError(
            f"RANK is set but {exc.args[0]} is not: run under torchrun, or "
            "without RANK to let pipestudio start the processes"
        ) from None


def connect(address: StoreAddress, world_size: int, timeout_s: float) -> dist.Store:
    store = dist.TCPStore(
        address.host,
        address.port,
        world_size,
        address.is_master,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    return dist.PrefixStore(address.prefix, store)


def choose_device(layout: EngineLayout, rank: int, device: str) -> torch.device:
    """CPU, or the CUDA device ``plan device % local GPUs`` (``device`` auto|cpu|cuda)."""
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise EngineError(
            f"device {device!r} was asked for but CUDA is not available (torch {torch.__version__})"
        )
    stage_idx, replica = layout.worker(rank)
    plan_device = layout.plan.worker_devices()[stage_idx][replica]
    return torch.device("cuda", plan_device % torch.cuda.device_count())


def join_timeout_s(timeout_s: float) -> float:
    return max(timeout_s, JOIN_TIMEOUT_S)


def _arrive(
    store: dist.Store,
    rank: int,
    world_size: int,
    timeout_s: float,
    key: str = "arrived",
    what: str = "start",
) -> None:
    """Wait until every rank has set ``key`` (by default: its process is up; see the
    module docstring)."""
    store.set(f"{key}/{rank}", "1")
    try:
        store.wait([f"{key}/{other}" for other in range(world_size)], timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        missing = [other for other in range(world_size) if not store.check([f"{key}/{other}"])]
        raise EngineError(
            f"rank {rank}: rank(s) {missing} did not {what} within {timeout_s:.0f} s"
        ) from exc


def join(
    layout: EngineLayout, rank: int, address: StoreAddress, device_kind: str, timeout_s: float
) -> RankContext:
    """Connect, create the process groups, agree on the clock (module docstring)."""
    world_size = layout.world_size
    timeout = timedelta(seconds=timeout_s)
    binding = bind_interfaces(address.own_address, address.host)
    store = connect(address, world_size, join_timeout_s(timeout_s))
    with listen(binding) as listener:
        store.set(f"address/{rank}", json.dumps([str(binding), listener.getsockname()[1]]))
        _arrive(store, rank, world_size, join_timeout_s(timeout_s))
        store.set_timeout(timeout)
        _check_peers(store, rank, world_size, binding, timeout_s)
        # a rank that cannot reach a peer fails after ``timeout_s`` of dialing, naming both
        # ends; the others wait longer, so that its reason, not theirs, fails the run first
        _arrive(store, rank, world_size, 2 * timeout_s, "checked", "reach its peers")
    device = choose_device(layout, rank, device_kind)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore("pg", store),
            rank=rank,
            world_size=world_size,
            timeout=timeout,
        )
        placement = [
            (str(host), str(where))
            for host, where in all_gather_json([socket.gethostname(), str(device)])
        ]
        groups = _make_groups(layout, rank, placement, timeout)
    except RuntimeError as exc:
        raise EngineError(unreachable(store, rank, world_size, binding, exc, timeout_s)) from exc
    if rank == 0:
        store.set("t0", repr(time.time()))
    clock = Clock(float(store.get("t0").decode()))
    return RankContext(
        rank, world_size, address, store, device, groups, clock, placement, timeout_s
    )


def _announced(store: dist.Store, rank: int, world_size: int) -> dict[int, tuple[str, int]]:
    """Each peer's address (with its interface) and the port it listens on to be dialed."""
    peers = {}
    for other in range(world_size):
        if other != rank:
            where, port = json.loads(store.get(f"address/{other}").decode())
            peers[other] = (str(where), int(port))
    return peers


def _check_peers(
    store: dist.Store, rank: int, world_size: int, binding: Binding, timeout_s: float
) -> None:
    """Dial every peer where it listens (``network.py``); fail naming those out of reach."""
    peers = _announced(store, rank, world_size)
    failed = unreachable_peers(
        {other: (where.split(" ")[0], port) for other, (where, port) in peers.items()}, timeout_s
    )
    if failed:
        listed = ", ".join(
            f"rank {other} at {peers[other][0]} port {peers[other][1]} ({why})"
            for other, why in failed.items()
        )
        raise EngineError(
            f"rank {rank} at {binding} could not reach {listed} within {timeout_s:.0f} s. "
            "Each rank binds gloo and NCCL to the interface that holds its worker's "
            "advertised address (--advertise-host) unless --interface, "
            "PIPESTUDIO_NETWORK_INTERFACE or GLOO_SOCKET_IFNAME names another; every host "
            "must reach the others' addresses on any TCP port"
        )


def unreachable(
    store: dist.Store,
    rank: int,
    world_size: int,
    binding: Binding,
    exc: BaseException,
    timeout_s: float,
) -> str:
    """Why ``rank`` could not connect to its peers once they had all been dialed: its
    address and theirs (the one the error says it dialed, else every peer's), and the
    library's own words."""
    try:
        peers = {other: where for other, (where, _) in _announced(store, rank, world_size).items()}
    except RuntimeError:  # the store is out of reach too: name no peer
        peers = {}
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    dialed = re.search(r"remote=\[([^\]]+)\]:(\d+)", text)
    named = {
        other: where
        for other, where in peers.items()
        if dialed is not None and where.split(" ")[0] == dialed.group(1)
    }
    listed = ", ".join(f"rank {other} at {where}" for other, where in (named or peers).items())
    if dialed is not None and not named:
        listed += f" (it dialed {dialed.group(1)}:{dialed.group(2)}, which no rank announced)"
    return (
        f"rank {rank} at {binding} could not connect to {listed or 'its peers'} within "
        f"{timeout_s:.0f} s: {text}"
    )


def _make_groups(
    layout: EngineLayout, rank: int, placement: list[tuple[str, str]], timeout: timedelta
) -> Groups:
    """Every rank creates every group, in the same order, as torch.distributed requires."""
    on_cuda = [device.startswith("cuda") for _, device in placement]
    groups = Groups()
    if all(on_cuda):
        pairs = {
            (src, dst)
            for stage in layout.stages
            for t in stage.sends
            for src in layout.stage_ranks(t.src_stage)
            for dst in layout.stage_ranks(t.dst_stage)
        }
        nccl_pairs = {pair for pair in pairs if placement[pair[0]] != placement[pair[1]]}
        if nccl_pairs:
            groups.activation = dist.new_group(backend="nccl", timeout=timeout)
            groups.gradient = dist.new_group(backend="nccl", timeout=timeout)
            groups.nccl_peers = {b for a, b in nccl_pairs if a == rank}
            groups.nccl_peers |= {a for a, b in nccl_pairs if b == rank}
    for stage_idx in range(layout.plan.num_stages):
        ranks = layout.stage_ranks(stage_idx)
        if len(ranks) == 1:
            continue
        members = [placement[r] for r in ranks]
        nccl = all(on_cuda[r] for r in ranks) and len(set(members)) == len(members)
        group = dist.new_group(ranks, timeout=timeout, backend="nccl" if nccl else "gloo")
        if rank in ranks:
            groups.replicas, groups.replicas_on_cpu = group, not nccl
    return groups


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
