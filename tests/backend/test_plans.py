"""/api/plans: every way of making a plan, simulate, compare, edit, states, provenance."""

from typing import Any

from fastapi.testclient import TestClient

from tests.backend.conftest import ANONYMOUS, AUTH, add_plan, add_profile, small_profile


def _cluster(client: TestClient, num_devices: int = 2, memory: int | None = None) -> int:
    levels = [{"name": "node", "size": num_devices, "bandwidth_gbps": 10.0}]
    devices = [{"name": f"d{i}", "memory_bytes": memory} for i in range(num_devices)]
    response = client.post(
        "/api/clusters",
        headers=AUTH,
        json={"name": "pair", "cluster": {"levels": levels, "devices": devices}},
    )
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def test_planner_plan_with_provenance_and_summary(client: TestClient) -> None:
    profile_id = add_profile(client)
    cluster_id = _cluster(client)
    response = client.post(
        "/api/plans",
        headers=AUTH,
        json={
            "profile_id": profile_id,
            "cluster_id": cluster_id,
            "author": "ada",
            "planner": {
                "algorithm": "balance-time",
                "num_stages": 2,
                "num_microbatches": 4,
                "schedule": "1f1b",
            },
        },
    )
    assert response.status_code == 201, response.text
    plan = response.json()
    assert (plan["planner"], plan["created_by"], plan["state"]) == ("balance-time", "ada", "draft")
    assert plan["parameters"]["num_stages"] == 2 and plan["parameters"]["planner_ms"] >= 0
    assert plan["document"]["provenance"]["author"] == "ada"
    assert plan["summary"]["step_time_ms"] > 0 and len(plan["summary"]["stage_busy_ms"]) == 2
    result = client.post(f"/api/plans/{plan['id']}/simulate", json={"steps": 2}).json()
    assert result["format"] == "pipestudio.simresult"
    assert abs(result["step_time_ms"] - plan["summary"]["step_time_ms"]) < 1e-9
    assert result["timeline"]
    conflict = client.delete(f"/api/clusters/{cluster_id}", headers=AUTH)
    assert conflict.status_code == 409


def test_manual_plan_edit_and_states(client: TestClient) -> None:
    profile_id = add_profile(client)
    plan = add_plan(client, profile_id, [1])
    assert [len(s["layers"]) for s in plan["document"]["stages"]] == [1, 3]
    edited = client.patch(
        f"/api/plans/{plan['id']}",
        headers=AUTH,
        json={"boundaries": [3], "policies": {"layer0": "recompute"}},
    ).json()
    assert [len(s["layers"]) for s in edited["document"]["stages"]] == [3, 1]
    assert edited["document"]["policies"]["layer0"] == "recompute"
    assert edited["summary"]["step_time_ms"] != plan["summary"]["step_time_ms"]
    approved = client.post(f"/api/plans/{plan['id']}/approve?force=true", headers=AUTH).json()
    assert approved["state"] == "approved" and approved["approved_at"]
    refused = client.patch(f"/api/plans/{plan['id']}", headers=AUTH, json={"boundaries": [2]})
    assert refused.status_code == 409
    back = client.patch(
        f"/api/plans/{plan['id']}", headers=AUTH, json={"boundaries": [2], "state": "draft"}
    ).json()
    assert back["state"] == "draft" and back["approved_at"] is None


def test_document_plan_preview_and_bad_input(client: TestClient) -> None:
    profile_id = add_profile(client)
    document = add_plan(client, profile_id, [2])["document"]
    stored = client.post(
        "/api/plans", headers=AUTH, json={"profile_id": profile_id, "plan": document}
    )
    assert stored.status_code == 201
    preview = client.post(
        "/api/plans/simulate",
        json={
            "profile_id": profile_id,
            "manual": {"boundaries": [2], "num_microbatches": 4, "schedule": "1f1b"},
            "with_timeline": False,
        },
    )
    assert preview.status_code == 200 and preview.json()["timeline"] == []
    overlap = {
        **document,
        "stages": [{"layers": ["layer0", "layer1"]}, {"layers": ["layer1", "layer2", "layer3"]}],
    }
    response = client.post(
        "/api/plans", headers=AUTH, json={"profile_id": profile_id, "plan": overlap}
    )
    assert response.status_code == 422
    assert "overlapping stages: layer 'layer1'" in response.json()["detail"][0]["msg"]
    both = client.post(
        "/api/plans",
        headers=AUTH,
        json={
            "profile_id": profile_id,
            "plan": document,
            "manual": {"boundaries": [1], "num_microbatches": 2, "schedule": "gpipe"},
        },
    )
    assert both.status_code == 422 and "exactly one" in both.text
    unknown = client.post(
        "/api/plans",
        headers=AUTH,
        json={
            "profile_id": profile_id,
            "planner": {"algorithm": "magic", "num_microbatches": 2, "schedule": "gpipe"},
        },
    )
    assert unknown.status_code == 422
    assert unknown.json()["detail"][0]["loc"] == ["body", "planner", "algorithm"]
    assert (
        client.post(
            "/api/plans", headers=AUTH, json={"profile_id": 404, "plan": document}
        ).status_code
        == 404
    )


def test_infeasible_planner_request_is_422(client: TestClient) -> None:
    profile_id = add_profile(client)
    response = client.post(
        "/api/plans",
        headers=AUTH,
        json={
            "profile_id": profile_id,
            "planner": {
                "algorithm": "optimal",
                "num_stages": 2,
                "num_microbatches": 4,
                "schedule": "gpipe",
                "device_memory_bytes": 10,
            },
        },
    )
    assert response.status_code == 422
    assert "memory" in response.json()["detail"][0]["msg"]


def test_compare_runs_every_planner_and_saves(client: TestClient) -> None:
    profile_id = add_profile(client)
    response = client.post(
        "/api/plans/compare",
        headers=AUTH,
        json={
            "profile_id": profile_id,
            "num_stages": 2,
            "num_microbatches": 4,
            "schedule": "gpipe",
            "algorithms": ["uniform", "optimal"],
            "save": True,
        },
    )
    assert response.status_code == 200, response.text
    rows = response.json()["rows"]
    assert [row["algorithm"] for row in rows] == ["uniform", "optimal"]
    optimal, uniform = rows[1]["summary"], rows[0]["summary"]
    assert optimal["step_time_ms"] <= uniform["step_time_ms"]
    stored = client.get("/api/plans", params={"profile_id": profile_id}).json()
    assert stored["count"] == 2
    assert {p["id"] for p in stored["data"]} == {row["plan_id"] for row in rows}


def test_a_profiles_precision_is_its_plans_and_a_mismatch_is_refused(client: TestClient) -> None:
    """A bf16 profile's plans train in bf16, whichever way they are made; a plan document
    in another precision is refused with a 422 naming both, and stores nothing."""
    response = client.post(
        "/api/profiles", headers=AUTH, json={"profile": {**small_profile(), "precision": "bf16"}}
    )
    assert response.status_code == 201, response.text
    profile = response.json()
    assert profile["precision"] == "bf16"
    made = [
        client.post("/api/plans", headers=AUTH, json={"profile_id": profile["id"], **how})
        for how in (
            {
                "planner": {
                    "algorithm": "balance-time",
                    "num_stages": 2,
                    "num_microbatches": 4,
                    "schedule": "1f1b",
                }
            },
            {"manual": {"boundaries": [2], "num_microbatches": 2, "schedule": "gpipe"}},
        )
    ]
    for response in made:
        assert response.status_code == 201, response.text
        plan = response.json()
        assert plan["precision"] == plan["document"]["precision"] == "bf16"
    before = client.get("/api/plans").json()["count"]
    document = {**made[0].json()["document"], "precision": "fp32"}
    refused = client.post(
        "/api/plans", headers=AUTH, json={"profile_id": profile["id"], "plan": document}
    )
    assert refused.status_code == 422
    assert "asks for precision 'fp32' but the profile was measured in 'bf16'" in refused.text
    assert client.get("/api/plans").json()["count"] == before


def test_hostile_precision_and_flops_are_refused_naming_the_field(client: TestClient) -> None:
    """A precision that is no precision (or hides a NUL byte) and FLOP counts that are
    negative, past 2**53 or not numbers get a 422 naming the field; nothing is stored."""
    before = client.get("/api/profiles").json()["count"]
    for layer_update, top in (
        ({}, {"precision": "fp8"}),
        ({}, {"precision": "bf16\x00"}),
        ({"fwd_flops": -1}, {}),
        ({"bwd_flops": 10**20}, {}),
        ({"fwd_flops": "NaN"}, {}),
        ({}, {"peak_tflops": 0}),
        ({}, {"peak_tflops": "Infinity"}),
        ({}, {"peak_tflops": 1e9}),
    ):
        profile = small_profile()
        profile["layers"][0].update(layer_update)
        response = client.post("/api/profiles", headers=AUTH, json={"profile": {**profile, **top}})
        assert response.status_code == 422, (layer_update, top, response.text)
        named = next(iter(top)) if top else next(iter(layer_update))
        assert named in response.text
    assert client.get("/api/profiles").json()["count"] == before


def _manual(
    client: TestClient, profile_id: int, cluster_id: int | None, boundaries: list[int]
) -> int:
    response = client.post(
        "/api/plans",
        headers=AUTH,
        json={
            "profile_id": profile_id,
            "cluster_id": cluster_id,
            "manual": {"boundaries": boundaries, "num_microbatches": 4, "schedule": "gpipe"},
        },
    )
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def test_approving_a_plan_that_cannot_run_as_planned_needs_force(
    client: TestClient, fake: Any
) -> None:
    """A plan over its cluster's memory, or with more ranks than the cluster's devices or
    the online workers' slots, is approved only with ``force``; the 422 names each problem
    and the plan stays a draft."""
    profile_id = add_profile(client)
    tight = _manual(client, profile_id, _cluster(client, memory=4000), [2])
    three = _manual(client, profile_id, None, [1, 2])
    response = client.post(f"/api/plans/{tight}/approve", headers=AUTH)
    assert response.status_code == 422, response.text
    error = response.json()["detail"][0]
    assert error["loc"] == ["body", "force"]
    assert "does not fit its cluster's memory (over: stage 0 by " in error["msg"]
    assert "needs 2 ranks but the online workers offer 0 slots" in error["msg"]
    assert client.get(f"/api/plans/{tight}").json()["state"] == "draft"
    fake("a"), fake("b", slots=1)
    response = client.patch(f"/api/plans/{three}", headers=AUTH, json={"state": "approved"})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["msg"] == (
        f"plan {three} needs 3 ranks but the online workers offer 2 slots: approve with "
        "force to run it anyway"
    )
    for forced in (
        client.post(f"/api/plans/{tight}/approve?force=true", headers=AUTH),
        client.patch(
            f"/api/plans/{three}", headers=AUTH, json={"state": "approved", "force": True}
        ),
    ):
        assert forced.status_code == 200 and forced.json()["state"] == "approved"
    fits = _manual(client, profile_id, _cluster(client), [2])
    response = client.post(f"/api/plans/{fits}/approve", headers=AUTH)
    assert response.status_code == 200 and response.json()["state"] == "approved"


def test_force_takes_a_credential_and_a_boolean_only(client: TestClient) -> None:
    """Approving with force needs a credential (401) and a real boolean: NaN, a NUL byte,
    10^13 or words answer 422 naming ``force``; the plan stays a draft throughout."""
    plan = add_plan(client, add_profile(client), [2])
    url = f"/api/plans/{plan['id']}/approve"
    assert client.post(f"{url}?force=true", headers=ANONYMOUS).status_code == 401
    for value in ("NaN", "%00", "10000000000000", "yes please"):
        response = client.post(f"{url}?force={value}", headers=AUTH)
        assert response.status_code == 422, (value, response.text)
        assert response.json()["detail"][0]["loc"] == ["query", "force"]
    response = client.patch(
        f"/api/plans/{plan['id']}", headers=AUTH, json={"state": "approved", "force": "NaN"}
    )
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "force"]
    assert client.get(f"/api/plans/{plan['id']}").json()["state"] == "draft"


def test_a_cluster_is_replaced_until_a_plan_uses_it(client: TestClient) -> None:
    """PUT replaces name and document; refused (409, naming the plans) once a plan was
    predicted on it; bad documents are 422 and change nothing; no credential, no change."""
    cluster_id = _cluster(client)
    wider = {
        "levels": [{"name": "node", "size": 4, "bandwidth_gbps": 25.0}],
        "devices": [{"name": f"d{i}", "memory_bytes": 2**30} for i in range(4)],
    }
    replaced = client.put(
        f"/api/clusters/{cluster_id}", headers=AUTH, json={"name": "four", "cluster": wider}
    )
    assert replaced.status_code == 200, replaced.text
    assert (replaced.json()["name"], replaced.json()["num_devices"]) == ("four", 4)
    assert (
        client.get(f"/api/clusters/{cluster_id}").json()["document"]["levels"][0]["bandwidth_gbps"]
        == 25.0
    )
    bad = client.put(
        f"/api/clusters/{cluster_id}",
        headers=AUTH,
        json={
            "cluster": {
                "levels": [{"name": "node", "size": 3, "bandwidth_gbps": 1.0}],
                "devices": [{"name": "d0"}],
            }
        },
    )
    assert bad.status_code == 422 and "3" in bad.text
    anonymous = client.put(
        f"/api/clusters/{cluster_id}", headers=ANONYMOUS, json={"cluster": wider}
    )
    assert anonymous.status_code == 401
    assert (
        client.put("/api/clusters/999999", headers=AUTH, json={"cluster": wider}).status_code == 404
    )
    assert client.get(f"/api/clusters/{cluster_id}").json()["num_devices"] == 4
    profile_id = add_profile(client)
    plan = client.post(
        "/api/plans",
        headers=AUTH,
        json={
            "profile_id": profile_id,
            "cluster_id": cluster_id,
            "planner": {
                "algorithm": "balance-time",
                "num_stages": 2,
                "num_microbatches": 4,
                "schedule": "1f1b",
            },
        },
    ).json()
    used = client.put(
        f"/api/clusters/{cluster_id}", headers=AUTH, json={"name": "two", "cluster": wider}
    )
    assert used.status_code == 409
    assert f"plan(s) {plan['id']}" in used.text and "new cluster" in used.text
    assert client.get(f"/api/clusters/{cluster_id}").json()["name"] == "four"


def test_hostile_cluster_replacements_change_nothing(client: TestClient) -> None:
    """A NUL byte in the name, a NaN or 10^12 Gbit/s link, 10^12 devices: 422 naming the
    field, and the stored cluster stays as it was."""
    cluster_id = _cluster(client)
    before = client.get(f"/api/clusters/{cluster_id}").json()
    level = {"name": "node", "size": 2, "bandwidth_gbps": 10.0}
    devices = [{"name": f"d{i}"} for i in range(2)]
    for body, field in (
        ({"name": "a\u0000", "cluster": {"levels": [level], "devices": devices}}, "name"),
        (
            {"cluster": {"levels": [{**level, "bandwidth_gbps": "NaN"}], "devices": devices}},
            "bandwidth_gbps",
        ),
        (
            {"cluster": {"levels": [{**level, "bandwidth_gbps": 1e12}], "devices": devices}},
            "bandwidth_gbps",
        ),
        ({"cluster": {"levels": [{**level, "size": 10**12}], "devices": devices}}, "size"),
    ):
        response = client.put(f"/api/clusters/{cluster_id}", headers=AUTH, json=body)
        assert response.status_code == 422, (body, response.text)
        assert field in str(response.json()["detail"][0]["loc"]), response.text
    assert client.get(f"/api/clusters/{cluster_id}").json() == before
