"""A run builds the model its plan was made for: without ``model`` and ``model_args`` it
takes those its profile recorded, and arguments that contradict the profile are refused at
once (422), before any worker is told anything."""

from collections.abc import Callable

from fastapi.testclient import TestClient

from tests.backend.conftest import AUTH, add_plan, add_profile, small_profile
from tests.backend.fakes import FakeWorker

CONFIG = {"config.layers": 2, "config.width": 32, "config.bias": True}


def _plan(client: TestClient, model: str = "mlp") -> int:
    profile = {**small_profile(4, model=model), "metadata": {**CONFIG, "torch": "2.x"}}
    return int(add_plan(client, add_profile(client, profile), [2], approve=True)["id"])


def _runs(client: TestClient) -> int:
    return int(client.get("/api/runs", headers=AUTH).json()["count"])


def test_a_run_without_model_builds_the_profiled_one(
        client: TestClient, fake: Callable[..., FakeWorker]) -> None:
    workers = [fake("a"), fake("b")]
    response = client.post("/api/runs", headers=AUTH,
                           json={"plan_id": _plan(client), "steps": 2})
    assert response.status_code == 201, response.text
    run = response.json()
    assert (run["model"], run["model_args"]) == (
        "mlp", {"layers": "2", "width": "32", "bias": "true"})
    assign = workers[0].expect("assign")
    assert (assign["config"]["model"], assign["config"]["model_args"]) == (
        run["model"], run["model_args"])


def test_arguments_that_contradict_the_profile_are_refused_at_once(
        client: TestClient, fake: Callable[..., FakeWorker]) -> None:
    workers = [fake("a"), fake("b")]
    plan_id = _plan(client)
    before = _runs(client)
    for args in ({"layers": "6"}, {"width": "32", "bias": "false"}):
        response = client.post("/api/runs", headers=AUTH, json={
            "plan_id": plan_id, "model": "mlp", "model_args": args, "steps": 2})
        assert response.status_code == 422, response.text
        error = response.json()["detail"][0]
        assert error["loc"] == ["body", "model_args"] and "the profile's" in error["msg"]
    assert "layers=6 (the profile's layers=2)" in client.post("/api/runs", headers=AUTH, json={
        "plan_id": plan_id, "model_args": {"layers": "6"}, "steps": 2}).json()["detail"][0][
        "msg"]
    assert _runs(client) == before
    assert all(not w.inbox for w in workers)
    # the same values in other spellings, and arguments the profile did not record, run
    same = {"layers": "2.0", "width": "32", "seed": "7"}
    response = client.post("/api/runs", headers=AUTH, json={
        "plan_id": plan_id, "model": "mlp", "model_args": same, "steps": 2})
    assert response.status_code == 201, response.text
    assert response.json()["model_args"] == same


def test_a_profile_of_no_built_in_model_needs_the_model_named(
        client: TestClient, fake: Callable[..., FakeWorker]) -> None:
    fake("a"), fake("b")
    plan_id = _plan(client, model="toy")
    response = client.post("/api/runs", headers=AUTH, json={"plan_id": plan_id, "steps": 2})
    assert response.status_code == 422, response.text
    error = response.json()["detail"][0]
    assert error["loc"] == ["body", "model"]
    assert "measured model 'toy', which is not a built-in model" in error["msg"]
    # another model is the caller's to answer for: its arguments are its own
    response = client.post("/api/runs", headers=AUTH, json={
        "plan_id": plan_id, "model": "mlp", "model_args": {"layers": "9"}, "steps": 2})
    assert response.status_code == 201, response.text
    assert response.json()["model_args"] == {"layers": "9"}


