"""A run builds the model its plan was made for: without ``model`` and ``model_args`` it
takes those its profile recorded; other arguments are named in its launch event."""

from collections.abc import Callable

from fastapi.testclient import TestClient

from tests.backend.conftest import AUTH, add_plan, add_profile, mlp_profile, small_profile
from tests.backend.fakes import FakeWorker

CONFIG = {"config.layers": 2, "config.width": 32, "config.bias": True}


def _plan(client: TestClient, model: str = "mlp") -> int:
    base = mlp_profile(CONFIG["config.layers"]) if model == "mlp" else small_profile(4, model=model)
    profile = {**base, "metadata": {**CONFIG, "torch": "2.x"}}
    return int(add_plan(client, add_profile(client, profile), [2], approve=True)["id"])


def _launch_event(client: TestClient, run_id: int) -> dict:  # type: ignore[type-arg]
    events = client.get(f"/api/runs/{run_id}/events", headers=AUTH).json()["data"]
    return next(event for event in events if event["kind"] == "launch")


def test_a_run_without_model_builds_the_profiled_one(
    client: TestClient, fake: Callable[..., FakeWorker]
) -> None:
    workers = [fake("a"), fake("b")]
    response = client.post("/api/runs", headers=AUTH, json={"plan_id": _plan(client), "steps": 2})
    assert response.status_code == 201, response.text
    run = response.json()
    assert (run["model"], run["model_args"]) == (
        "mlp",
        {"layers": "2", "width": "32", "bias": "true"},
    )
    assign = workers[0].expect("assign")
    assert (assign["config"]["model"], assign["config"]["model_args"]) == (
        run["model"],
        run["model_args"],
    )


def test_arguments_other_than_the_profiles_are_named_in_the_launch_event(
    client: TestClient, fake: Callable[..., FakeWorker]
) -> None:
    """A smaller model to try a plan on runs, but its launch event says which arguments
    differ from the profile's: the plan's predictions are for the profiled model."""
    fake("a", slots=2), fake("b", slots=2)
    plan_id = _plan(client)
    response = client.post(
        "/api/runs",
        headers=AUTH,
        json={
            "plan_id": plan_id,
            "model": "mlp",
            "model_args": {"layers": "2", "width": "8", "seed": "7"},
            "steps": 2,
        },
    )
    assert response.status_code == 201, response.text
    run = response.json()
    assert run["model_args"] == {"layers": "2", "width": "8", "seed": "7"}
    launch = _launch_event(client, run["id"])
    assert launch["data"]["differs_from_profile"] == ["width=8 (the profile's width=32)"]
    assert "the plan's predictions are for the profiled model" in launch["message"]
    # the same values (a whole number the worker takes as one), and arguments the profile
    # did not record: nothing
    same = {"layers": "+2", "width": "32", "seed": "7"}
    response = client.post(
        "/api/runs",
        headers=AUTH,
        json={"plan_id": plan_id, "model": "mlp", "model_args": same, "steps": 2},
    )
    assert response.status_code == 201, response.text
    assert response.json()["model_args"] == same
    launch = _launch_event(client, response.json()["id"])
    assert "differs_from_profile" not in launch["data"]


def test_hostile_models_and_arguments_are_refused_and_nothing_starts(
    client: TestClient, fake: Callable[..., FakeWorker]
) -> None:
    workers = [fake("a"), fake("b")]
    plan_id = _plan(client)
    for body, where in (
        ({"model": "mlp\x00"}, ["body", "model"]),
        ({"model": "x" * 300}, ["body", "model"]),
        ({"model_args": {"layers": "1\x00"}}, ["body", "model_args", "layers"]),
    ):
        response = client.post(
            "/api/runs", headers=AUTH, json={"plan_id": plan_id, "steps": 1, **body}
        )
        assert response.status_code == 422, (body, response.text)
        assert response.json()["detail"][0]["loc"] == where
    assert client.get("/api/runs", headers=AUTH).json()["count"] == 0
    assert all(not w.inbox for w in workers)


def test_a_profile_of_no_built_in_model_needs_the_model_named(
    client: TestClient, fake: Callable[..., FakeWorker]
) -> None:
    fake("a"), fake("b")
    plan_id = _plan(client, model="toy")
    response = client.post("/api/runs", headers=AUTH, json={"plan_id": plan_id, "steps": 2})
    assert response.status_code == 422, response.text
    error = response.json()["detail"][0]
    assert error["loc"] == ["body", "model"]
    assert "measured model 'toy', which is not a built-in model" in error["msg"]
    # another model must still build the plan's layers, which the built-in mlp does not
    response = client.post(
        "/api/runs",
        headers=AUTH,
        json={"plan_id": plan_id, "model": "mlp", "model_args": {"layers": "9"}, "steps": 2},
    )
    assert response.status_code == 422, response.text
    error = response.json()["detail"][0]
    assert error["loc"] == ["body", "model"]
    assert (
        "the plan places layer(s) layer0, layer1, layer2, layer3, which it does not have"
        in error["msg"]
    ), error["msg"]


def test_a_model_that_does_not_build_the_plan_is_refused_at_once(
    client: TestClient, fake: Callable[..., FakeWorker]
) -> None:
    """Arguments that give the model other layers than the plan places are refused before
    any worker hears of the run (422 naming the layers), and nothing is stored."""
    workers = [fake("a"), fake("b")]
    plan_id = _plan(client)  # mlp of 2 blocks: block0, block1, head
    for args, words in (
        ({"layers": "3"}, "its layer(s) block2 are in no stage of the plan"),
        ({"layers": "1"}, "the plan places layer(s) block1, which it does not have"),
        ({"layers": "many"}, "layers='many' is not a whole number"),
        ({"layers": "100001"}, "layers=100001 is outside 1..100000"),
    ):
        response = client.post(
            "/api/runs", headers=AUTH, json={"plan_id": plan_id, "model_args": args, "steps": 2}
        )
        assert response.status_code == 422, (args, response.text)
        error = response.json()["detail"][0]
        assert error["loc"] == ["body", "model_args"] and words in error["msg"], error
    assert client.get("/api/runs", headers=AUTH).json()["count"] == 0
    assert all(not w.inbox for w in workers)
    assert client.get(f"/api/plans/{plan_id}", headers=AUTH).json()["state"] == "approved"
    # the profile's own arguments build it
    assert (
        client.post(
            "/api/runs",
            headers=AUTH,
            json={"plan_id": plan_id, "model_args": {"layers": "2"}, "steps": 2},
        ).status_code
        == 201
    )


def test_an_interleaved_plan_launches_one_rank_per_device(
    client: TestClient, fake: Callable[..., FakeWorker]
) -> None:
    """Two devices of two chunks each: four stages, two ranks; rank d's row names its
    first chunk d. The planners refuse the new schedules by name (422)."""
    worker = fake("w", slots=2)
    profile_id = add_profile(client, mlp_profile())
    plan = add_plan(
        client, profile_id, [1, 2, 3], approve=True, schedule="interleaved-1f1b", virtual_stages=2
    )
    assert plan["document"]["virtual_stages"] == 2 and len(plan["document"]["stages"]) == 4
    launched = client.post("/api/runs", headers=AUTH, json={"plan_id": plan["id"], "steps": 1})
    assert launched.status_code == 201, launched.text
    assign = worker.expect("assign")
    assert assign["world_size"] == 2
    assert [(r["rank"], r["stage"]) for r in assign["ranks"]] == [(0, 0), (1, 1)]
    planned = client.post(
        "/api/plans",
        headers=AUTH,
        json={
            "profile_id": profile_id,
            "planner": {
                "algorithm": "balance-time",
                "num_stages": 2,
                "num_microbatches": 4,
                "schedule": "zero-bubble",
            },
        },
    )
    assert planned.status_code == 422, planned.text
    error = planned.json()["detail"][0]
    assert error["loc"][-1] == "schedule", error
    assert "the planners plan gpipe, 1f1b, pipedream" in error["msg"]
    # auto: each planner's fastest fitting schedule, every candidate in its provenance
    compared = client.post(
        "/api/plans/compare",
        headers=AUTH,
        json={
            "profile_id": profile_id,
            "num_stages": 2,
            "num_microbatches": 4,
            "schedule": "auto",
            "algorithms": ["balance-time"],
        },
    )
    assert compared.status_code == 200, compared.text
    row = compared.json()["rows"][0]
    assert row["error"] is None, row
    provenance = row["plan"]["provenance"]
    assert provenance["schedule_chosen_by"] == "auto"
    assert {"auto gpipe", "auto 1f1b", "auto zero-bubble"} <= set(provenance)
