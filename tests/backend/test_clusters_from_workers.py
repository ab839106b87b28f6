"""A cluster made of the registered workers: a device per slot, grouped by host."""

import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pipestudio.backend.services.links import rounds
from tests.backend.conftest import add_profile

GIB = 2**30


def _gpu(index: int, memory: int = 80 * GIB) -> dict[str, Any]:
    return {"kind": "cuda", "index": index, "name": "H100", "memory_bytes": memory}


def test_hosts_are_the_outer_level_and_slots_the_devices(client: TestClient, fake: Any) -> None:
    fake("a", slots=2, host="10.0.0.2", devices=[_gpu(0), _gpu(1, 40 * GIB)])
    fake("b", slots=1, host="10.0.0.3", devices=[_gpu(0)])
    fake("c", slots=1, host="10.0.0.3", devices=[_gpu(0)])
    response = client.post(
        "/api/clusters/from-workers", json={"between_hosts_gbps": 0.2, "within_host_gbps": 100}
    )
    assert response.status_code == 201, response.text
    cluster = response.json()
    assert cluster["name"] == "2 hosts" and cluster["num_devices"] == 4
    document = cluster["document"]
    assert [
        (level["name"], level["size"], level["bandwidth_gbps"]) for level in document["levels"]
    ] == [
        ("host", 2, 100.0),
        ("network", 2, 0.2),
    ]
    assert [(d["name"], d["memory_bytes"]) for d in document["devices"]] == [
        ("a/0", 80 * GIB),
        ("a/1", 40 * GIB),
        ("b/0", 80 * GIB),
        ("c/0", 80 * GIB),
    ]
    # the planner plans on it
    profile_id = add_profile(client)
    plan = client.post(
        "/api/plans",
        json={
            "profile_id": profile_id,
            "cluster_id": cluster["id"],
            "planner": {
                "algorithm": "pipedream",
                "num_microbatches": 4,
                "schedule": "1f1b",
                "num_stages": 2,
            },
        },
    )
    assert plan.status_code == 201, plan.text


def test_cpu_slots_share_their_host_memory_and_one_host_is_one_level(
    client: TestClient, fake: Any
) -> None:
    cpu = {"kind": "cpu", "index": 0, "name": "cpu", "memory_bytes": 8 * GIB}
    worker = fake("solo", slots=2, host="10.0.0.9", devices=[cpu])
    response = client.post(
        "/api/clusters/from-workers", json={"worker_ids": [worker.id], "name": "bench"}
    )
    assert response.status_code == 201, response.text
    document = response.json()["document"]
    assert document["name"] == "bench" and len(document["levels"]) == 1
    assert [d["memory_bytes"] for d in document["devices"]] == [4 * GIB, 4 * GIB]


def test_uneven_hosts_and_absent_workers_are_refused_by_name(client: TestClient, fake: Any) -> None:
    fake("a", slots=2, host="10.0.0.2")
    fake("b", slots=1, host="10.0.0.3")
    response = client.post("/api/clusters/from-workers", json={})
    assert response.status_code == 409, response.text
    assert "10.0.0.2 2, 10.0.0.3 1" in response.json()["detail"]
    response = client.post("/api/clusters/from-workers", json={"worker_ids": ["nobody"]})
    assert response.status_code == 409 and "nobody" in response.json()["detail"], response.text
    assert client.get("/api/clusters").json()["count"] == 0


def test_without_workers_there_is_no_cluster(client: TestClient) -> None:
    response = client.post("/api/clusters/from-workers", json={})
    assert response.status_code == 409 and "no online worker" in response.json()["detail"]
    refused = client.post("/api/clusters/from-workers", json={"between_hosts_gbps": -1})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == [
        "body",
        "between_hosts_gbps",
    ]


def test_it_needs_a_credential_and_refuses_hostile_values_by_name(
    client: TestClient, fake: Any
) -> None:
    fake("a", slots=1, host="10.0.0.2")
    anonymous = client.post("/api/clusters/from-workers", json={}, headers={"Authorization": ""})
    assert anonymous.status_code == 401, anonymous.text
    for body, field in (
        ({"between_hosts_gbps": float("nan")}, "between_hosts_gbps"),
        ({"within_host_gbps": 1e12}, "within_host_gbps"),
        ({"name": "a\u0000b"}, "name"),
        ({"worker_ids": ["x"] * 10_001}, "worker_ids"),
        ({"worker_ids": "a"}, "worker_ids"),
    ):
        response = client.post(
            "/api/clusters/from-workers",
            content=json.dumps(body, allow_nan=True),
            headers={"Content-Type": "application/json"},
        )
        assert response.status_code == 422, (body, response.text)
        assert response.json()["detail"][0]["loc"][:2] == ["body", field], response.text
    assert client.get("/api/clusters").json()["count"] == 0


def _scripted(worker: Any, answer: Any) -> list[dict[str, Any]]:
    """Let ``worker`` answer each request with ``answer(message)`` (a frame's text, or
    None for no answer) in a thread; returns the requests it got."""
    got: list[dict[str, Any]] = []

    def serve() -> None:
        with contextlib.suppress(Exception):
            while True:
                message = worker.socket.receive_json()
                got.append(message)
                text = answer(message) if message["type"] != "ack" else None
                if text is not None:
                    worker.socket.send_text(text)

    threading.Thread(target=serve, daemon=True).start()
    return got


def _ok(request: dict[str, Any], /, ok: bool = True, **fields: Any) -> str:
    """A ``reply`` to ``request``, unnumbered as the agent sends it (``protocol.py``)."""
    return json.dumps({"type": "reply", "request_id": request["request_id"], "ok": ok, **fields})


def _pair(fake: Any, measure: Any) -> tuple[Any, Any]:
    """Two workers on two hosts: the receiver expects probes, the sender answers
    ``measure_link`` with ``measure(message)``."""
    sender = fake("a", slots=1, host="10.0.0.2", probe_port=4000)
    receiver = fake("b", slots=1, host="10.0.0.3", probe_port=4001)
    _scripted(receiver, _ok)
    _scripted(sender, lambda m: measure(m) if m["type"] == "measure_link" else None)
    return sender, receiver


def test_workers_measure_the_links_between_hosts(client: TestClient, fake: Any) -> None:
    hosts = [f"10.0.0.{idx}" for idx in range(2, 6)]
    rates = {(a, b): 0.1 * (i + j) for i, a in enumerate(hosts) for j, b in enumerate(hosts)}

    def answer(host: str) -> Callable[[dict[str, Any]], str]:
        def reply(message: dict[str, Any]) -> str:
            if message["type"] == "probe_expect":
                return _ok(message)
            gbps = rates[(host, message["host"])]
            return _ok(message, gbps=gbps, latency_ms=0.1, bytes=2**24, seconds=0.3)

        return reply

    requests = [
        _scripted(fake(f"w{idx}", slots=1, host=host, probe_port=4000 + idx), answer(host))
        for idx, host in enumerate(hosts)
    ]
    response = client.post(
        "/api/clusters/from-workers", json={"measure_links": True, "measure_seconds": 0.5}
    )
    assert response.status_code == 201, response.text
    cluster = response.json()
    # every pair once, in the direction it was measured; the slowest is the network's
    pairs = {(link["from_host"], link["to_host"]): link["gbps"] for link in cluster["links"]}
    assert len(pairs) == 6 and {frozenset(pair) for pair in pairs} == {
        frozenset((a, b)) for a in hosts for b in hosts if a < b
    }
    assert all(gbps == rates[pair] for pair, gbps in pairs.items())
    assert cluster["document"]["levels"][1] == {
        "name": "network",
        "size": 4,
        "bandwidth_gbps": min(pairs.values()),
    }
    assert cluster["name"] == f"4 hosts, links measured ({min(pairs.values()):.3g} Gbit/s slowest)"
    # each receiver was told the key its sender presents, at the probe its hello named
    expects = {m["key"] for got in requests for m in got if m["type"] == "probe_expect"}
    measures = [m for got in requests for m in got if m["type"] == "measure_link"]
    assert len(expects) == 6 and {m["key"] for m in measures} == expects
    assert all(m["port"] == 4000 + hosts.index(m["host"]) for m in measures)
    assert all(m["seconds"] == 0.5 and len(m["key"]) == 64 for m in measures)
    # a bandwidth given wins over the measured one; the links are measured and listed
    given = client.post(
        "/api/clusters/from-workers", json={"measure_links": True, "between_hosts_gbps": 0.05}
    )
    assert given.status_code == 201, given.text
    assert given.json()["document"]["levels"][1]["bandwidth_gbps"] == 0.05
    assert len(given.json()["links"]) == 6 and given.json()["name"] == "4 hosts"


def test_a_link_that_cannot_be_measured_is_a_409_naming_both_ends(
    client: TestClient, fake: Any
) -> None:
    refused = "worker a: ConnectionRefusedError: [Errno 111] Connection refused"
    _pair(fake, lambda m: _ok(m, ok=False, message=refused))
    response = client.post("/api/links", json={"seconds": 0.1})
    assert response.status_code == 409, response.text
    detail = response.json()["detail"]
    assert "from worker a" in detail and "on 10.0.0.2" in detail, detail
    assert "to worker b" in detail and "on 10.0.0.3" in detail, detail
    assert "Connection refused" in detail, detail


def test_a_worker_without_a_probe_is_named(client: TestClient, fake: Any) -> None:
    fake("a", slots=1, host="10.0.0.2", probe_port=4000)
    fake("old", slots=1, host="10.0.0.3")
    response = client.post("/api/clusters/from-workers", json={"measure_links": True})
    assert response.status_code == 409, response.text
    assert "worker old" in response.json()["detail"] and "probe_port" in response.json()["detail"]
    assert client.get("/api/clusters").json()["count"] == 0


def test_a_malformed_reply_closes_its_worker_and_fails_the_measurement(
    client: TestClient, fake: Any
) -> None:
    # NaN is what Python's json writes for a float('nan'); a link has no such bandwidth
    _pair(fake, lambda m: _ok(m, gbps=float("nan")))
    response = client.post("/api/clusters/from-workers", json={"measure_links": True})
    assert response.status_code == 409, response.text
    detail = response.json()["detail"]
    assert "malformed reply: gbps" in detail and "worker a" in detail, detail
    assert client.get("/api/clusters").json()["count"] == 0
    deadline = time.monotonic() + 5  # the server closed the sender's connection (1007)
    while client.get("/api/health").json()["workers_online"] != 1:
        assert time.monotonic() < deadline, "the sender is still connected"
        time.sleep(0.05)


def test_a_worker_cannot_answer_another_workers_request(client: TestClient, fake: Any) -> None:
    sender = fake("a", slots=1, host="10.0.0.2", probe_port=4000)
    receiver = fake("b", slots=1, host="10.0.0.3", probe_port=4001)
    intruder = fake("c", slots=0, host="10.0.0.4", probe_port=4002)

    def receive(message: dict[str, Any]) -> str:
        # the intruder answers first with the request's id, as if it were the receiver
        intruder.socket.send_text(_ok(message, ok=False, message="hijacked"))
        time.sleep(0.2)
        return _ok(message)

    _scripted(receiver, receive)
    _scripted(sender, lambda m: _ok(m, gbps=1.5, latency_ms=0.05, bytes=2**20, seconds=0.2))
    response = client.post("/api/links", json={})
    assert response.status_code == 200, response.text
    assert [link["gbps"] for link in response.json()["data"]] == [1.5]
    # a reply to no request is dropped; the intruder stays connected
    intruder.socket.send_text(_ok({"request_id": "nothing"}))
    intruder.socket.send_text(json.dumps({"type": "heartbeat"}))
    assert client.get(f"/api/workers/{intruder.id}").json()["state"] == "online"


def test_link_measurement_needs_a_credential_and_sane_values(client: TestClient, fake: Any) -> None:
    fake("a", slots=1, host="10.0.0.2", probe_port=4000)
    for path in ("/api/links", "/api/clusters/from-workers"):
        anonymous = client.post(path, json={}, headers={"Authorization": ""})
        assert anonymous.status_code == 401, anonymous.text
    for path, body, field in (  # each: (path, body, the field the 422 names)
        ("/api/clusters/from-workers", {"measure_seconds": float("nan")}, "measure_seconds"),
        ("/api/clusters/from-workers", {"measure_seconds": 0}, "measure_seconds"),
        ("/api/clusters/from-workers", {"measure_links": "yes"}, "measure_links"),
        ("/api/links", {"seconds": 31}, "seconds"),
        ("/api/links", {"seconds": "1"}, "seconds"),
        ("/api/links", {"worker_ids": ["x" * 65]}, "worker_ids"),
    ):
        response = client.post(
            path,
            content=json.dumps(body, allow_nan=True),
            headers={"Content-Type": "application/json"},
        )
        assert response.status_code == 422, (body, response.text)
        error = response.json()["detail"][0]
        assert error["loc"][:2] == ["body", field], error
    assert client.get("/api/clusters").json()["count"] == 0


@pytest.mark.parametrize("count", range(1, 10))
def test_rounds_pair_every_two_hosts_once_and_each_host_once_a_round(count: int) -> None:
    schedule = rounds(count)
    pairs = [pair for round_ in schedule for pair in round_]
    assert sorted(pairs) == [(a, b) for a in range(count) for b in range(a + 1, count)]
    for round_ in schedule:
        members = [member for pair in round_ for member in pair]
        assert len(members) == len(set(members))
    assert len(schedule) == (count - 1 if count % 2 == 0 else count)
