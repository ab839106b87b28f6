"""The interface a rank binds gloo and NCCL to, and the check that it reaches its peers."""

import socket

import pytest

from pipestudio.runtime.engine.network import (
    Binding,
    InterfaceError,
    bind_interfaces,
    check_interface,
    interface_addresses,
    interface_of,
    listen,
    unreachable_peers,
)


def test_the_loopback_address_is_on_the_loopback_interface() -> None:
    assert "127.0.0.1" in interface_addresses()["lo"]
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("localhost") == "lo"
    assert interface_of("203.0.113.77") is None  # TEST-NET-3: on no interface


def test_the_interface_of_the_own_address_is_named_for_gloo_and_nccl() -> None:
    env: dict[str, str] = {}
    assert bind_interfaces("127.0.0.1", "10.9.9.9", env) == Binding("127.0.0.1", "lo")
    assert env == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


def test_without_an_own_address_the_route_to_the_store_decides() -> None:
    env: dict[str, str] = {}
    assert bind_interfaces(None, "127.0.0.1", env) == Binding("127.0.0.1", "lo")
    # an advertised address no interface here holds (a NAT's): the route's interface, and
    # its address, which gloo announces and peers dial
    env = {}
    assert bind_interfaces("203.0.113.77", "127.0.0.1", env) == Binding("127.0.0.1", "lo")
    assert env["GLOO_SOCKET_IFNAME"] == "lo"


def test_variables_set_by_hand_win_and_the_binding_says_where_gloo_listens() -> None:
    other = next((n for n in interface_addresses() if n != "lo"), None)
    if other is None:
        pytest.skip("this host has no interface besides lo")
    env = {"GLOO_SOCKET_IFNAME": "lo"}
    binding = bind_interfaces(interface_addresses()[other][0], "127.0.0.1", env)
    assert binding == Binding("127.0.0.1", "lo")
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["NCCL_SOCKET_IFNAME"] == other
    env = {"PIPESTUDIO_NETWORK_INTERFACE": "lo"}
    assert bind_interfaces(interface_addresses()[other][0], "127.0.0.1", env).interface == "lo"
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"


def test_an_unknown_interface_is_named_with_those_there_are() -> None:
    assert check_interface("lo") == "lo"
    with pytest.raises(InterfaceError, match=r"'nosuch0' is not on this host.*lo \(127\.0\.0\.1"):
        check_interface("nosuch0")


def test_peers_that_listen_are_reached_and_a_closed_port_is_named() -> None:
    with listen(Binding("127.0.0.1", "lo")) as listener:
        port = listener.getsockname()[1]
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
        closed.close()
        failed = unreachable_peers({1: ("127.0.0.1", port), 2: ("127.0.0.1", dead)}, 2.0)
    assert list(failed) == [2] and "refused" in failed[2].lower()


def test_an_advertised_address_of_no_interface_here_still_listens() -> None:
    """An address advertised through NAT is on no interface of this host: the listener
    takes every interface rather than failing the rank."""
    with listen(Binding("203.0.113.77", None)) as listener:
        port = listener.getsockname()[1]
        assert unreachable_peers({1: ("127.0.0.1", port)}, 2.0) == {}
