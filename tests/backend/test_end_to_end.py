"""End to end: ``pipestudio serve`` plus two CPU ``pipestudio worker`` processes train a
2-stage plan; metrics land in the database and stream to a dashboard; an approved proposal
migrates a layer; a killed worker fails its run, or resumes it from its checkpoint when
asked; a backend restart loses nothing."""

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.backend.conftest import AUTH, mlp_profile
from tests.backend.live import read
from tests.backend.processes import (
    TINY_MLP,
    alive,
    descendants,
    start_backend,
    start_worker,
    stop,
    wait_for,
)


def _mlp_profile() -> dict[str, Any]:
    return mlp_profile(int(TINY_MLP["layers"]))


@pytest.fixture
def system(database_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A backend and two workers, all registered."""
    log = tmp_path / "backend.log"
    backend, url = start_backend(database_url, log)
    workers = [start_worker(url, f"w{i}", tmp_path / f"w{i}.log") for i in range(2)]
    state = {
        "url": url,
        "backend": backend,
        "workers": workers,
        "log": log,
        "database_url": database_url,
        "tmp": tmp_path,
    }
    try:
        wait_for(
            lambda: httpx.get(f"{url}/api/health").json()["workers_online"] == 2, 60, "two workers"
        )
        yield state
    finally:
        for process in [*state["workers"], state["backend"]]:
            stop(process)


def _launch(url: str, steps: int, **request: Any) -> int:
    profile = httpx.post(
        f"{url}/api/profiles", headers=AUTH, json={"profile": _mlp_profile()}
    ).json()
    plan = httpx.post(
        f"{url}/api/plans",
        headers=AUTH,
        json={
            "profile_id": profile["id"],
            "manual": {"boundaries": [2], "num_microbatches": 4, "schedule": "1f1b"},
        },
    ).json()
    httpx.post(f"{url}/api/plans/{plan['id']}/approve?force=true", headers=AUTH).raise_for_status()
    response = httpx.post(
        f"{url}/api/runs",
        headers=AUTH,
        json={
            "plan_id": plan["id"],
            "model": "mlp",
            "model_args": TINY_MLP,
            "steps": steps,
            "device": "cpu",
            "threads_per_rank": 1,
            "seed": 0,
            **request,
        },
    )
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def _run(url: str, run_id: int) -> dict[str, Any]:
    run: dict[str, Any] = read(f"{url}/api/runs/{run_id}").json()
    return run


def test_train_stream_and_migrate(system: dict[str, Any]) -> None:
    url = system["url"]
    run_id = _launch(url, steps=100_000)
    streamed: list[dict[str, Any]] = []
    with connect(
        url.replace("http", "ws") + f"/ws/runs/{run_id}", additional_headers=AUTH
    ) as dashboard:
        while not any(
            m["type"] == "metrics" and any(e["type"] == "step" for e in m["events"])
            for m in streamed
        ):
            streamed.append(json.loads(dashboard.recv(timeout=90)))
    assert streamed[0]["type"] == "run"
    wait_for(lambda: (_run(url, run_id)["last_step"] or 0) >= 2, 60, "three steps")
    stored = read(f"{url}/api/runs/{run_id}/metrics", params={"kind": "step"}).json()
    assert {m["stage"] for m in stored["data"]} == {0, 1}
    assert any("loss" in m["data"] for m in stored["data"])

    observed = _mlp_profile()
    for layer in observed["layers"][:2]:
        layer.update(fwd_ms=50.0, bwd_ms=100.0)
    proposal = httpx.post(
        f"{url}/api/proposals", headers=AUTH, json={"run_id": run_id, "observed_profile": observed}
    ).json()
    assert proposal["worthwhile"], proposal["document"]["reason"]
    assert proposal["document"]["moves"] == [{"layer": "block1", "from_stage": 0, "to_stage": 1}]
    approved = httpx.post(f"{url}/api/proposals/{proposal['id']}/approve", headers=AUTH)
    assert approved.status_code == 200, approved.text
    done = wait_for(
        lambda: (
            read(f"{url}/api/proposals/{proposal['id']}").json()
            if read(f"{url}/api/proposals/{proposal['id']}").json()["state"] != "approved"
            else None
        ),
        60,
        "the migration's outcome",
    )
    assert done["state"] == "applied", done["outcome"]

    def done_by_both_stages() -> list[dict[str, Any]]:
        events = read(f"{url}/api/runs/{run_id}/events", params={"kind": "migration"}).json()[
            "data"
        ]
        done = [e["data"] for e in events if e["data"].get("phase") == "done"]
        return done if {e["stage"] for e in done} == {0, 1} else []

    done_events = wait_for(done_by_both_stages, 60, "both stages to finish the migration")
    by_stage = {e["stage"]: e for e in done_events}
    assert by_stage[0]["layers_out"] and by_stage[1]["layers_in"]
    assert by_stage[0]["sent_bytes"] > 0
    stop_response = httpx.post(f"{url}/api/runs/{run_id}/stop", headers=AUTH)
    assert stop_response.json()["state"] == "stopped"


def test_short_run_finishes(system: dict[str, Any]) -> None:
    url = system["url"]
    run_id = _launch(url, steps=5)
    run = wait_for(
        lambda: (
            _run(url, run_id) if _run(url, run_id)["state"] not in ("starting", "running") else None
        ),
        120,
        "the run to end",
    )
    assert run["state"] == "finished", run["message"]
    assert run["last_step"] == 4
    steps = read(f"{url}/api/runs/{run_id}/metrics", params={"kind": "step"}).json()
    assert steps["total"] == 10
    kinds = {e["kind"] for e in read(f"{url}/api/runs/{run_id}/events").json()["data"]}
    assert {"launch", "start", "summary", "finished"} <= kinds


def test_killed_worker_fails_the_run_and_restart_keeps_data(system: dict[str, Any]) -> None:
    url = system["url"]
    run_id = _launch(url, steps=100_000)
    wait_for(lambda: (_run(url, run_id)["last_step"] or 0) >= 1, 90, "training")
    ranks = descendants(system["workers"][1].pid)
    assert ranks, "the worker runs its rank in a process of its own"
    system["workers"][1].send_signal(signal.SIGKILL)
    system["workers"][1].wait()
    # no process of the killed worker lives on, holding its peers or its memory
    wait_for(lambda: not alive(ranks), 15, f"the killed worker's processes {ranks} to end")
    run = wait_for(
        lambda: _run(url, run_id) if _run(url, run_id)["state"] == "failed" else None,
        30,
        "the run to fail",
    )
    assert run["message"]
    before = read(f"{url}/api/runs/{run_id}/metrics").json()["total"]

    port = int(url.rsplit(":", 1)[1])
    stop(system["backend"])
    system["backend"], url = start_backend(system["database_url"], system["log"], port)
    assert read(f"{url}/api/runs/{run_id}/metrics").json()["total"] >= before
    assert _run(url, run_id)["state"] == "failed"
    wait_for(
        lambda: httpx.get(f"{url}/api/health").json()["workers_online"] == 1,
        30,
        "the surviving worker to reconnect",
    )


def test_killed_worker_resumes_the_run_from_its_checkpoint(system: dict[str, Any]) -> None:
    url = system["url"]
    run_id = _launch(url, steps=100_000, on_failure="resume", checkpoint_every=2)
    wait_for(lambda: (_run(url, run_id)["last_step"] or 0) >= 5, 90, "training")
    system["workers"][1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    system["workers"][1].wait()
    system["workers"].append(start_worker(url, "spare", system["tmp"] / "spare.log"))

    def resumed_starts() -> list[dict[str, Any]]:
        events = read(f"{url}/api/runs/{run_id}/events", params={"kind": "start"}).json()
        starts = [e["data"] for e in events["data"] if e["data"].get("attempt") == 1]
        return starts if len(starts) == 2 else []

    starts = wait_for(resumed_starts, 60, "the second attempt's ranks to start")
    resumed_s = time.monotonic() - killed
    run = _run(url, run_id)
    assert (run["state"], run["attempt"]) == ("running", 1), run
    spare = read(f"{url}/api/workers").json()["data"][-1]
    assert spare["name"] == "spare" and spare["id"] in {r["worker_id"] for r in run["ranks"]}
    start_step = starts[0]["start_step"]
    assert (
        start_step >= 2
        and start_step % 2 == 0
        and {s["start_step"] for s in starts} == {start_step}
    )
    assert resumed_s < 30, f"resumed {resumed_s:.1f} s after the kill"
    kinds = [e["kind"] for e in read(f"{url}/api/runs/{run_id}/events").json()["data"]]
    assert "resuming" in kinds and "resume" in kinds and "failed" not in kinds

    def resumed_steps() -> list[int]:
        rows = read(
            f"{url}/api/runs/{run_id}/metrics", params={"kind": "step", "max_points": 100_000}
        ).json()
        steps = sorted(m["step"] for m in rows["data"] if m["data"].get("attempt") == 1)
        return steps if len(steps) >= 4 else []

    assert wait_for(resumed_steps, 60, "steps of the second attempt")[0] == start_step
    assert httpx.post(f"{url}/api/runs/{run_id}/stop", headers=AUTH).json()["state"] == "stopped"
