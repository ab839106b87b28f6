"""Which network interface a rank's gloo and NCCL connections use.

Gloo and NCCL pick an interface by themselves when ``GLOO_SOCKET_IFNAME`` and
``NCCL_SOCKET_IFNAME`` are unset: gloo takes the address the host name resolves to, and on
many Debian hosts and containers that is a loopback address, which every rank on another
host then fails to dial. So before it joins, a rank names the interface itself
(``bind_interfaces``), first found of:

1. ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` already set (each library keeps its own);
2. ``PIPESTUDIO_NETWORK_INTERFACE`` (``pipestudio worker --interface``,
   ``pipestudio train --interface``): one interface for both;
3. the interface that holds the rank's own address: the address its worker advertises
   (``--advertise-host``), else the one this host uses on its route to the job's store
   (the store's host under torchrun, ``MASTER_ADDR``); an advertised address that no
   interface here holds (a NAT's) falls back to that route's interface.

The same address, with the interface, is what a rank tells its peers. Before gloo
connects, every rank dials a socket each peer listens on there (``listen``,
``unreachable_peers``): a rank that cannot reach a peer fails within the job's timeout,
naming both addresses, where gloo would retry for several timeouts and name neither.
"""

import ctypes
import ctypes.util
import ipaddress
import os
import socket
import sys
import time
from collections.abc import MutableMapping
from dataclasses import dataclass

#: The setting that names the interface of both libraries (see the module docstring).
INTERFACE_VARIABLE = "PIPESTUDIO_NETWORK_INTERFACE"
#: The variables gloo and NCCL read.
LIBRARY_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True)
class Binding:
    """Where a rank's connections go out: its address and the interface that holds it
    (None where no interface of this host holds the address)."""

    address: str
    interface: str | None

    def __str__(self) -> str:
        return self.address if self.interface is None else f"{self.address} ({self.interface})"


class _SockAddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_ubyte * 14)]


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [
    ("next", ctypes.POINTER(_IfAddrs)),
    ("name", ctypes.c_char_p),
    ("flags", ctypes.c_uint),
    ("addr", ctypes.POINTER(_SockAddr)),
    ("netmask", ctypes.POINTER(_SockAddr)),
    ("broadaddr", ctypes.POINTER(_SockAddr)),
    ("data", ctypes.c_void_p),
]


def interface_addresses() -> dict[str, list[str]]:
    """Every IPv4 and IPv6 address of each interface of this host (``getifaddrs``);
    empty where the C library does not offer it."""
    libc_name = ctypes.util.find_library("c")
    if not sys.platform.startswith("linux") or libc_name is None:
        return {}
    libc = ctypes.CDLL(libc_name, use_errno=True)
    head = ctypes.POINTER(_IfAddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        return {}
    found: dict[str, list[str]] = {}
    try:
        entry = head
        while entry:
            item = entry.contents
            if item.addr:
                family = item.addr.contents.family
                address = None
                if family == socket.AF_INET:  # sockaddr_in: family, port, address
                    raw = ctypes.string_at(item.addr, 8)
                    address = socket.inet_ntop(socket.AF_INET, raw[4:8])
                elif family == socket.AF_INET6:  # sockaddr_in6: ..., flow info, address
                    raw = ctypes.string_at(item.addr, 24)
                    address = socket.inet_ntop(socket.AF_INET6, raw[8:24])
                if address is not None:
                    found.setdefault(item.name.decode(), []).append(address)
            entry = item.next
    finally:
        libc.freeifaddrs(head)
    return found


def interface_of(address: str) -> str | None:
    """The interface that holds ``address`` (a name resolves first), or None."""
    try:
        wanted = ipaddress.ip_address(socket.gethostbyname(address))
    except (OSError, ValueError):
        return None
    for name, addresses in interface_addresses().items():
        if any(ipaddress.ip_address(a.split("%")[0]) == wanted for a in addresses):
            return name
    return None


class InterfaceError(ValueError):
    """An interface asked for by name that this host does not have."""


def check_interface(name: str) -> str:
    """``name`` when this host has an interface of that name with an address; else
    ``InterfaceError`` naming it and the interfaces there are."""
    addresses = interface_addresses()
    if name not in addresses:
        known = ", ".join(f"{n} ({' '.join(a)})" for n, a in sorted(addresses.items()))
        raise InterfaceError(
            f"network interface {name!r} is not on this host or has no address; "
            f"it has: {known or 'none found'}"
        )
    return name


def _first(addresses: list[str]) -> str:
    """IPv4 before IPv6."""
    return sorted(addresses, key=lambda a: ":" in a)[0]


def address_of_interface(name: str) -> str:
    """The first address of interface ``name``, IPv4 before IPv6 (``check_interface``)."""
    return _first(interface_addresses()[check_interface(name)])


def route_address(host: str) -> str:
    """This host's address on its route to ``host`` (a UDP socket's source: nothing is
    sent); the address ``host`` resolves to when it is this host's own."""
    try:
        target = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def bind_interfaces(
    own_address: str | None, store_host: str, env: MutableMapping[str, str] | None = None
) -> Binding:
    """Name the interface of gloo and NCCL in ``env`` (this process's environment) as the
    module docstring says, and return where this rank listens: the address and interface
    gloo uses (the interface's own address when a variable names another interface than
    the one holding ``own_address``). A variable already set is kept."""
    env = os.environ if env is None else env
    address = own_address or route_address(store_host)
    holder = interface_of(address)
    interface = (
        env.get(INTERFACE_VARIABLE)
        or holder
        # an address of no interface here (advertised through NAT): the route to the store's
        or (interface_of(route_address(store_host)) if own_address else None)
    )
    if interface:
        for variable in LIBRARY_VARIABLES:
            env.setdefault(variable, interface)
    chosen = env.get("GLOO_SOCKET_IFNAME") or interface
    if chosen and chosen != holder:
        addresses = interface_addresses().get(chosen)
        if addresses:
            address = _first(addresses)
    return Binding(address, chosen)


def listen(binding: Binding) -> socket.socket:
    """A socket listening on ``binding``'s address, on a port the OS picks: peers dial it
    to show that they can reach this rank where gloo will listen (``check_peers``)."""
    family = socket.AF_INET6 if ":" in binding.address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.bind((binding.address, 0))
    except OSError:  # an address of no interface here (advertised through NAT): all of them
        listener.bind(("", 0))
    listener.listen(1024)  # the kernel completes the handshakes; nothing needs accepting
    return listener


def unreachable_peers(peers: dict[int, tuple[str, int]], timeout_s: float) -> dict[int, str]:
    """The peers (rank: (address, port)) a TCP connection did not reach within
    ``timeout_s`` in all, each with the reason."""
    failed: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    for rank, (address, port) in sorted(peers.items()):
        try:
            with socket.create_connection(
                (address, port), timeout=max(deadline - time.monotonic(), 0.5)
            ):
                pass
        except OSError as exc:
            failed[rank] = exc.strerror or type(exc).__name__
    return failed
