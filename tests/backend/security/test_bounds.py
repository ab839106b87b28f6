"""Bounds on everything that drives work or storage (backend/inputs.py, the documents'
limits, the simulation budget): a value the store cannot hold or a request beyond the
work budget answers 422 naming the field, and stores nothing."""

import json
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pipestudio.backend.app import create_app
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.simulator import simulate as simulate_module
from tests.backend.conftest import ANONYMOUS, add_profile, make_settings, small_profile


def _refused(response: Any, *place: str | int) -> str:
    assert response.status_code == 422, response.text
    error = response.json()["detail"][0]
    assert error["loc"][: len(place) + 1] == ["body", *place], error
    return str(error["msg"])


def _nothing_stored(client: TestClient) -> None:
    for kind in ("profiles", "plans", "clusters"):
        assert client.get(f"/api/{kind}").json()["count"] <= 1, kind


def test_column_limits_answer_422(client: TestClient) -> None:
    huge = small_profile()
    huge["microbatch_size"] = 10**12
    _refused(client.post("/api/profiles", json={"profile": huge}), "profile", "microbatch_size")
    long_model = small_profile(model="m" * 300)
    _refused(client.post("/api/profiles", json={"profile": long_model}), "profile", "model")
    nan = small_profile()
    nan["metadata"] = {"note": float("nan")}
    body = json.dumps({"profile": nan})  # Python writes the NaN token JSON has not
    msg = _refused(
        client.post("/api/profiles", content=body, headers={"content-type": "application/json"}),
        "profile",
        "metadata",
        "note",
    )
    assert "not a JSON number" in msg
    named = small_profile()
    named["layers"][0]["name"] = "a\u0000b"
    assert "NUL" in _refused(
        client.post("/api/profiles", json={"profile": named}), "profile", "layers", 0, "name"
    )
    surrogate = json.dumps({"profile": small_profile()}).replace('"layer0"', '"\\ud800"')
    assert "lone surrogate" in _refused(
        client.post(
            "/api/profiles", content=surrogate, headers={"content-type": "application/json"}
        ),
        "profile",
        "layers",
    )
    plan = client.post(
        "/api/plans",
        json={
            "profile_id": 1,
            "manual": {
                "boundaries": [2],
                "num_microbatches": 2,
                "schedule": "gpipe",
                "microbatch_size": 10**12,
            },
        },
    )
    _refused(plan, "manual", "microbatch_size")
    assert client.get("/api/profiles").json()["count"] == 0
    assert (
        client.post(
            "/api/clusters",
            json={
                "name": "x" * 201,
                "cluster": {
                    "levels": [{"size": 1, "bandwidth_gbps": None}],
                    "devices": [{"name": "d"}],
                },
            },
        ).status_code
        == 422
    )
    assert client.get("/api/clusters").json()["count"] == 0


def test_a_stored_document_stays_readable(client: TestClient) -> None:
    profile_id = add_profile(client)
    assert client.get(f"/api/profiles/{profile_id}").status_code == 200
    odd = small_profile()
    odd["layers"][0]["kind"] = "Überschicht 🚀"  # text beyond ASCII is text
    created = client.post("/api/profiles", json={"profile": odd})
    assert created.status_code == 201
    read = client.get(f"/api/profiles/{created.json()['id']}")
    assert read.json()["document"]["layers"][0]["kind"] == "Überschicht 🚀"


@pytest.mark.parametrize("with_token", [True, False])
def test_simulating_a_million_micro_batches_is_refused_at_once(
    database_url: str, with_token: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before the simulator builds a single op: the check counts ops from the
    plan's shape (``simulator/budget.py``), so how long the refusal takes does not grow
    with the micro-batches asked for. Counting the graphs built, not timing the request,
    keeps this exact on a loaded machine."""
    graphs_built: list[int] = []
    real_build = simulate_module._Build

    def counting_build(*args: Any, **kwargs: Any) -> Any:
        graphs_built.append(1)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(simulate_module, "_Build", counting_build)
    settings = make_settings(database_url, public_reads=True)
    with TestClient(
        create_app(settings), headers={"Authorization": "Bearer test-api-token"}
    ) as client:
        profile_id = add_profile(client)
        headers = {} if with_token else ANONYMOUS
        for microbatches, field in ((10**6, "num_microbatches"), (90_000, "num_microbatches")):
            response = client.post(
                "/api/plans/simulate",
                headers=headers,
                json={
                    "profile_id": profile_id,
                    "manual": {
                        "boundaries": [1, 2, 3],
                        "num_microbatches": microbatches,
                        "schedule": "1f1b",
                    },
                },
            )
            msg = _refused(response, "manual", field)
            assert "100000" in msg or "limit of 150000" in msg, msg
            assert not graphs_built, f"{microbatches} micro-batches reached the simulator"
        fine = client.post(
            "/api/plans/simulate",
            headers=headers,
            json={
                "profile_id": profile_id,
                "manual": {"boundaries": [1, 2, 3], "num_microbatches": 64, "schedule": "1f1b"},
            },
        )
        assert fine.status_code == 200
        assert graphs_built, "the counter sees the simulations that do run"


@pytest.fixture
def started_planners(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The planners started meanwhile: each is replaced by one that only records its name."""
    started: list[str] = []
    for name in PLANNERS:
        monkeypatch.setitem(PLANNERS, name, lambda request, name=name: started.append(name))
    return started


def test_planners_share_the_budget(client: TestClient, started_planners: list[str]) -> None:
    profile_id = add_profile(client)
    refused = client.post(
        "/api/plans/compare",
        json={
            "profile_id": profile_id,
            "num_stages": 4,
            "num_microbatches": 99_999,
            "schedule": "1f1b",
        },
    )
    assert "num_microbatches=99999" in _refused(refused, "num_microbatches")
    # refused before any planner runs: planning 99,999 micro-batches would take minutes
    assert not started_planners
    refused = client.post(
        "/api/plans",
        json={
            "profile_id": profile_id,
            "planner": {
                "algorithm": "uniform",
                "num_stages": 4,
                "num_microbatches": 99_999,
                "schedule": "1f1b",
            },
        },
    )
    _refused(refused, "planner", "num_microbatches")
    assert not started_planners


def test_deeply_nested_and_undecodable_bodies_answer_422(client: TestClient) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    for body, words in ((deep, "nests too deeply"), (b"\xff\xfe{}", "not UTF-8")):
        response = client.post(
            "/api/clusters", content=body, headers={"content-type": "application/json"}
        )
        assert response.status_code == 422 and words in response.text, response.text
    assert client.get("/api/runs/1/events", params={"kind": "a\u0000"}).status_code == 422
    assert client.get("/api/workers/" + "w" * 65).status_code == 422


def test_a_planners_search_is_bounded_too(client: TestClient, started_planners: list[str]) -> None:
    """A 20,000-layer profile planned onto 5,000 stages took 28 s and 6.5 GB in the
    optimal planner before any simulation; now it is refused before the planner starts."""
    huge = {
        "model": "huge",
        "microbatch_size": 1,
        "layers": [{"name": f"l{i}", "fwd_ms": 1, "bwd_ms": 2} for i in range(20_000)],
    }
    profile_id = client.post("/api/profiles", json={"profile": huge}).json()["id"]
    for algorithm in ("optimal", "vpipe", "pipedream"):
        started = time.perf_counter()
        refused = client.post(
            "/api/plans/simulate",
            json={
                "profile_id": profile_id,
                "planner": {
                    "algorithm": algorithm,
                    "num_stages": 5000,
                    "num_microbatches": 4,
                    "schedule": "1f1b",
                },
            },
        )
        assert "at most 64 workers" in _refused(refused, "planner", "num_stages")
        assert not started_planners
        # what is left is reading the profile: seconds on a loaded machine, never 28
        assert time.perf_counter() - started < 10.0
