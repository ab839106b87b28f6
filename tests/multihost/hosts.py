"""Hosts made of Linux network namespaces, for tests of runs across machines.

``Hosts(count)`` makes a bridge on the root side (address ``GATEWAY``, where the backend
listens) and ``count`` namespaces, each linked to the bridge by a veth pair whose inner end
is the namespace's ``eth0`` with one address of a /24 of its own. A namespace shares the
machine's file system and host name (which resolves to a loopback address on many Debian
hosts and containers: the case that sends gloo to the wrong interface), not its network.
A link can be shaped to a rate (``tc`` token bucket on both ends, so each direction is
capped) and with a delay (``netem``, where the kernel has it), cut and restored.
``close`` stops the processes started in the hosts and removes every link and namespace.
"""

import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_COUNTER = itertools.count()
#: What a run across hosts must not inherit: it shows that no variable is needed.
NETWORK_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "PIPESTUDIO_NETWORK_INTERFACE")


class HostsUnavailable(RuntimeError):
    """Namespaces cannot be made here; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _tc(namespace: str | None, *args: str) -> None:
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    result = subprocess.run([*prefix, "tc", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise HostsUnavailable(f"tc {' '.join(args)}: {result.stderr.strip()}")


def why_unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "making network namespaces needs root (CAP_NET_ADMIN)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (Debian: apt-get install iproute2)"
    name = f"psprobe{os.getpid()}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


@dataclass
class Host:
    """One namespace: its name, its address on the bridge, its link's root-side end."""

    namespace: str
    address: str
    link: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def command(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *argv]


class Hosts:
    """``count`` namespace hosts on one bridge (module docstring)."""

    def __init__(self, count: int, rates_mbit: Sequence[float | None] | None = None) -> None:
        reason = why_unavailable()
        if reason is not None:
            raise HostsUnavailable(reason)
        tag = f"{os.getpid() % 10000}x{next(_COUNTER)}"
        subnet = 100 + (os.getpid() + next(_COUNTER)) % 150
        self.prefix = f"10.213.{subnet}"
        self.gateway = f"{self.prefix}.1"
        self.bridge = f"psb{tag}"
        self.hosts: list[Host] = []
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for idx in range(count):
                self.hosts.append(self._add(f"ps{tag}h{idx}", f"{self.prefix}.{idx + 2}"))
            for idx, rate in enumerate(rates_mbit or []):
                if rate is not None:
                    self.shape(idx, rate)
        except BaseException:
            self.close()
            raise

    def _add(self, namespace: str, address: str) -> Host:
        link = f"{namespace}r"
        _ip("netns", "add", namespace)
        host = Host(namespace, address, link)
        _ip("link", "add", link, "type", "veth", "peer", "name", f"{namespace}n")
        _ip("link", "set", f"{namespace}n", "netns", namespace)
        _ip("-n", namespace, "link", "set", f"{namespace}n", "name", "eth0")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", namespace, "route", "add", "default", "via", self.gateway)
        _ip("link", "set", link, "master", self.bridge)
        _ip("link", "set", link, "up")
        return host

    def __getitem__(self, idx: int) -> Host:
        return self.hosts[idx]

    def __len__(self) -> int:
        return len(self.hosts)

    def shape(self, idx: int, rate_mbit: float, delay_ms: float | None = None) -> None:
        """Cap host ``idx``'s link at ``rate_mbit`` in each direction (and delay it)."""
        host = self.hosts[idx]
        rate = f"{rate_mbit:g}mbit"
        # A bucket of 1 ms at the rate (the least a 1000 Hz kernel allows), never below
        # a jumbo frame: a larger one lets a transfer of a few hundred KB through at the
        # veth's own speed (5 ms at 1 Gbit/s measured 1.9 Gbit/s over gloo).
        burst = f"{max(int(rate_mbit * 1e6 / 8 * 0.001), 9100)}"
        for namespace, device in ((None, host.link), (host.namespace, "eth0")):
            _tc(namespace, "qdisc", "replace", "dev", device, "root", "handle", "1:", "tbf",
                "rate", rate, "burst", burst, "latency", "200ms")  # fmt: skip
            if delay_ms is not None:
                _tc(namespace, "qdisc", "replace", "dev", device, "parent", "1:1", "handle",
                    "10:", "netem", "delay", f"{delay_ms:g}ms")  # fmt: skip

    def unshape(self, idx: int) -> None:
        """Take host ``idx``'s link back to the veth's own speed."""
        host = self.hosts[idx]
        for namespace, device in ((None, host.link), (host.namespace, "eth0")):
            _tc(namespace, "qdisc", "del", "dev", device, "root")

    def add_stray_interface(self, idx: int, name: str, address: str) -> None:
        """Give host ``idx`` an interface ``name`` holding ``address`` that no other host
        has a route to (one end of a veth pair whose other end is in the same host)."""
        namespace = self.hosts[idx].namespace
        _ip("-n", namespace, "link", "add", name, "type", "veth", "peer", "name", f"{name}p")
        _ip("-n", namespace, "addr", "add", f"{address}/32", "dev", name)
        for device in (name, f"{name}p"):
            _ip("-n", namespace, "link", "set", device, "up")

    def cut(self, idx: int) -> None:
        """Take host ``idx``'s link down: nothing reaches it or leaves it."""
        _ip("link", "set", self.hosts[idx].link, "down")

    def restore(self, idx: int) -> None:
        _ip("link", "set", self.hosts[idx].link, "up")

    def free_port(self, idx: int) -> int:
        """A port nothing listens on in host ``idx`` (its network namespace is its own)."""
        probe = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
        found = subprocess.run(
            self.hosts[idx].command([sys.executable, "-c", probe]), capture_output=True, text=True
        )
        return int(found.stdout)

    def torchrun(self, idx: int, port: int, train: Sequence[str]) -> list[str]:
        """``torchrun`` of ``pipestudio train`` with ``train``'s arguments on host ``idx``:
        one rank per host, the rendezvous on host 0's ``port``."""
        return [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(self.hosts)),
            "--node-rank", str(idx), "--nproc-per-node", "1",
            "--master-addr", self.hosts[0].address, "--master-port", str(port),
            "-m", "pipestudio", "train", *train,
        ]  # fmt: skip

    def start(
        self, idx: int, argv: Sequence[str], log: Path, **popen: Any
    ) -> subprocess.Popen[bytes]:
        """Run ``argv`` in host ``idx``, its output appended to ``log``."""
        host = self.hosts[idx]
        process = subprocess.Popen(
            host.command(argv), stdout=log.open("ab"), stderr=subprocess.STDOUT, **popen
        )
        host.processes.append(process)
        return process

    def close(self) -> None:
        for host in self.hosts:
            for process in host.processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
            _ip("netns", "del", host.namespace, check=False)
            _ip("link", "del", host.link, check=False)
        _ip("link", "del", self.bridge, check=False)
        self.hosts = []
