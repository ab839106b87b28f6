"""What must not jam a real system, end to end on each database: ``pipestudio serve`` and
two real CPU workers. A run at a learning rate of 1e15 ends failed with the reason "loss
is NaN at step N (stage S)", every metric the ranks sent is stored (the NaN loss as data),
both workers stay connected, and the next launch trains to the end. A stranger's 500
poisoned messages disconnect neither worker and fail no run."""

import json
import math
import time
from typing import Any

import httpx
from websockets.sync.client import connect

from tests.backend.conftest import AUTH, WORKER_TOKEN
from tests.backend.live import read
from tests.backend.processes import wait_for
from tests.backend.security.test_ingest import _poison
from tests.backend.test_end_to_end import _launch, _run, system

__all__ = ["system"]  # the fixture: a backend and two workers


def test_a_nan_loss_fails_the_run_and_jams_nothing(system: dict[str, Any]) -> None:
    url = system["url"]
    run_id = _launch(url, steps=20, lr=1e15)
    run = wait_for(
        lambda: (r := _run(url, run_id))["state"] in ("failed", "finished") and r,
        120,
        "the run to end",
    )
    assert run["state"] == "failed", run
    # the worker of rank 0, which waited on rank 1's gradient, may report first: its rank's
    # words end with the cause, which the run's reason becomes once rank 1's worker reports
    run = wait_for(
        lambda: (r := _run(url, run_id))["message"].startswith("loss is NaN") and r,
        30,
        f"the run's reason to be its cause, not {run['message']!r}",
    )
    assert run["message"].startswith("loss is NaN at step ") and run["message"].endswith(
        "(stage 1)"
    ), run["message"]
    nan_step = int(run["message"].split("step ")[1].split(" ")[0])
    steps = read(f"{url}/api/runs/{run_id}/metrics", params={"kind": "step"}).json()["data"]
    last_stage = sorted((m["step"], m["data"].get("loss")) for m in steps if m["stage"] == 1)
    assert [step for step, _ in last_stage] == list(range(nan_step + 1)), last_stage
    assert last_stage[-1][1] == "NaN", "the diverged loss is stored as data"
    assert all(math.isfinite(loss) for _, loss in last_stage[:-1])
    assert {m["step"] for m in steps if m["stage"] == 0} == set(range(nan_step + 1))
    events = read(f"{url}/api/runs/{run_id}/events").json()["data"]
    assert not [e for e in events if e["kind"] == "rejected"], "nothing was refused"
    assert httpx.get(f"{url}/api/health").json()["workers_online"] == 2
    again = _launch(url, steps=3)
    done = wait_for(
        lambda: (r := _run(url, again))["state"] in ("failed", "finished") and r,
        120,
        "the next run to end",
    )
    assert done["state"] == "finished", done
    assert httpx.get(f"{url}/api/runs/{again}", headers=AUTH).json()["last_step"] == 2


def test_500_poisoned_messages_from_a_stranger_disturb_no_real_worker(
    system: dict[str, Any],
) -> None:
    """While two real workers train, a third connection with the worker token sends 500
    messages the backend cannot store or must not believe; the real workers are never
    disconnected, the run ends finished with all its metrics, and every poisoned message
    is acked (so none is resent) and recorded on the run."""
    url = system["url"]
    run_id = _launch(url, steps=30)
    wait_for(lambda: _run(url, run_id)["state"] == "running", 60, "the run to start")
    with connect(
        url.replace("http", "ws") + "/ws/worker",
        additional_headers={"Authorization": f"Bearer {WORKER_TOKEN}"},
    ) as socket:
        socket.send(json.dumps({"type": "hello", "name": "stranger", "host": "10.9.9.9"}))
        assert json.loads(socket.recv(timeout=30))["type"] == "welcome"
        for seq in range(1, 501):
            socket.send(json.dumps({**_poison(run_id, seq), "seq": seq}))
        acked, deadline = 0, time.monotonic() + 60
        while acked < 500:
            # it heartbeats while it waits, as every worker does: storing 500 messages may
            # take longer than the silence after which a worker is closed
            socket.send('{"type": "heartbeat"}')
            try:
                message = json.loads(socket.recv(timeout=1))
            except TimeoutError:
                assert time.monotonic() < deadline, f"only {acked} of 500 acked"
                continue
            acked = max(acked, message.get("seq", 0) if message["type"] == "ack" else 0)
    run = wait_for(
        lambda: (r := _run(url, run_id))["state"] in ("failed", "finished") and r,
        120,
        "the run to end",
    )
    assert run["state"] == "finished", run["message"]
    steps = read(f"{url}/api/runs/{run_id}/metrics", params={"kind": "step"}).json()
    assert steps["total"] == 2 * 30
    rejected = read(
        f"{url}/api/runs/{run_id}/events", params={"kind": "rejected", "limit": 1000}
    ).json()["count"]
    assert rejected >= 400
    log = system["log"].read_text()
    assert "closing to resync" not in log and "reconnect and resend" not in log
    for name in ("w0", "w1"):
        worker_log = (system["tmp"] / f"{name}.log").read_text()
        assert worker_log.count("registered with") == 1, f"{name} reconnected:\n{worker_log}"
