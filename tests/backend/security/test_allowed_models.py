"""Workers decide what code they run (allowlist.py): the backend refuses a run whose model
no chosen worker allows, before anything starts, and a worker refuses it too, before
importing anything."""

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pipestudio.allowlist import AllowListError, model_allowed, parse_patterns
from pipestudio.runtime.agent.agent import Agent
from tests.backend.conftest import add_plan, add_profile, mlp_profile
from tests.backend.fakes import FakeWorker

Workers = Callable[..., FakeWorker]


def _launch(client: TestClient, model: str, **extra: Any) -> Any:
    profile = mlp_profile() if model == "mlp" else None  # a built-in model's own layers
    plan = add_plan(client, add_profile(client, profile), [2], approve=True)
    return client.post(
        "/api/runs", json={"plan_id": plan["id"], "model": model, "steps": 1, **extra}
    )


@pytest.mark.parametrize(
    "model",
    [
        "subprocess:getoutput",
        "os:system",
        "mypkg.models:build",
        "/tmp/evil.py:build",
        "../evil.py:x",
    ],
)
def test_the_backend_refuses_a_model_no_worker_allows(
    client: TestClient, fake: Workers, model: str
) -> None:
    workers = [fake("a"), fake("b", allowed_models=["other.pkg:*"])]
    refused = _launch(client, model)
    assert refused.status_code == 409, refused.text
    detail = refused.json()["detail"]
    assert repr(model) in detail and all(w.id in detail for w in workers), detail
    assert client.get("/api/runs").json()["count"] == 0
    for worker in workers:  # nothing was sent to any worker
        worker.expect_ack(worker.send({"type": "heartbeat_probe", "run_id": 1}))
        assert not [m for m in worker.inbox if m["type"] == "assign"]


def test_a_run_goes_only_to_workers_that_allow_its_model(client: TestClient, fake: Workers) -> None:
    fake("strict")
    open_minded = [
        fake("o1", allowed_models=["mypkg.models:*"]),
        fake("o2", allowed_models=["mypkg.*:build"]),
    ]
    launched = _launch(client, "mypkg.models:build")
    assert launched.status_code == 201, launched.text
    assert [r["worker_id"] for r in launched.json()["ranks"]] == [w.id for w in open_minded]
    built_in = _launch(client, "mlp")
    assert built_in.status_code == 409 and "free slot" in built_in.json()["detail"]


def test_chosen_workers_must_all_allow_the_model(client: TestClient, fake: Workers) -> None:
    workers = [fake("a", allowed_models=["mypkg.models:*"]), fake("b")]
    refused = _launch(client, "mypkg.models:build", worker_ids=[w.id for w in workers])
    assert refused.status_code == 409
    assert f"b ({workers[1].id})" in refused.json()["detail"]
    assert f"a ({workers[0].id})" not in refused.json()["detail"]


def test_the_worker_refuses_before_importing(tmp_path: Path) -> None:
    evil = tmp_path / "evil.py"
    touched = tmp_path / "touched"
    evil.write_text(f"open({str(touched)!r}, 'w').close()\ndef build(): pass\n")
    agent = Agent(
        "http://127.0.0.1:9", "token", name="w0", device="cpu", allowed_models=["mypkg.models:*"]
    )  # never dials
    posted: list[dict[str, Any]] = []
    agent._post = posted.append  # type: ignore[method-assign]
    agent._loop = asyncio.new_event_loop()
    try:
        for model in (f"{evil}:build", "subprocess:getoutput"):
            agent._assign(
                {
                    "type": "assign",
                    "run_id": 3,
                    "attempt": 0,
                    "world_size": 1,
                    "ranks": [{"rank": 0, "stage": 0, "replica": 0}],
                    "open_store": True,
                    "config": {"model": model, "plan": {}},
                }
            )
            state = posted.pop()
            assert (state["state"], state["retry"]) == ("failed", False)
            assert f"does not allow model {model!r}" in state["message"]
    finally:
        agent._loop.close()
    assert not touched.exists(), "the worker imported a model it does not allow"
    assert agent._hello()["allowed_models"] == ["mypkg.models:*"]
    assert "mlp" in agent._hello()["models"]


def test_patterns() -> None:
    assert parse_patterns(["a.b:*, c:d", ""]) == ["a.b:*", "c:d"]
    with pytest.raises(AllowListError, match="MODULE:FACTORY"):
        parse_patterns(["no-colon"])
    assert model_allowed("mlp", ["mlp"], [])
    assert not model_allowed("mlp2", ["mlp"], ["mlp:*"])
    assert model_allowed("pkg.sub:f", [], ["pkg.*:f"])
    assert not model_allowed("PKG.sub:f", [], ["pkg.*:f"])
    assert model_allowed("models/net.py:build", [], ["models/*.py:build"])
    for climbing in ("models/../../tmp/x.py:build", "models/..\\x.py:build"):
        assert not model_allowed(climbing, [], ["models/*.py:build", "*"]), climbing
