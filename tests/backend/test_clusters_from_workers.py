"""A cluster made of the registered workers: a device per slot, grouped by host."""

import json
from typing import Any

from fastapi.testclient import TestClient

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
