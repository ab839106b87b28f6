"""The worker agent's answer to an assignment (pipestudio/runtime/agent/agent.py): a run
whose configuration it refuses, or whose loss becomes non-finite, fails as the run's own
fault, so no attempt resumes it."""

import asyncio
import time
from typing import Any

from pipestudio.runtime.agent.agent import Agent
from tests.runtime.engine.helpers import make_plan

TINY_MLP = {"layers": "2", "width": "8", "in_features": "4", "out_features": "3"}


def _assign(stages: list[list[str]]) -> dict[str, Any]:
    plan = make_plan("mlp", stages, "1f1b")
    return {"type": "assign", "run_id": 7, "attempt": 1, "world_size": 2,
            "ranks": [{"rank": 0, "stage": 0, "replica": 0}], "open_store": False,
            "config": {"plan": plan.model_dump(mode="json"), "model": "mlp",
                       "model_args": TINY_MLP, "steps": 3, "device": "cpu"}}


def test_a_refused_configuration_is_reported_as_not_worth_retrying() -> None:
    agent = Agent("http://127.0.0.1:9", "token", name="w0", device="cpu")  # never dials
    posted: list[dict[str, Any]] = []
    agent._post = posted.append  # type: ignore[method-assign]

    agent._assign(_assign([["block0", "block1"], ["head"]]))
    assert posted == [] and (7, 1) in agent.assignments

    agent._assign(_assign([["block0", "block9"], ["head"]]))
    [state] = posted
    assert {k: state[k] for k in ("type", "run_id", "attempt", "state", "retry")} == {
        "type": "run_state", "run_id": 7, "attempt": 1, "state": "failed", "retry": False}
    assert state["message"].startswith("worker w0: ") and "'block9'" in state["message"]
    assert (7, 1) not in agent.assignments


def test_a_nonfinite_loss_fails_the_run_as_not_worth_retrying() -> None:
    agent = Agent("http://127.0.0.1:9", "token", name="w0", device="cpu")  # never dials
    posted: list[dict[str, Any]] = []
    agent._post = posted.append  # type: ignore[method-assign]
    agent._loop = asyncio.new_event_loop()  # takes the events, never runs
    assign = _assign([["block0", "block1"], ["head"]])
    assign.update(ranks=[{"rank": 0, "stage": 0, "replica": 0},
                         {"rank": 1, "stage": 1, "replica": 0}], open_store=True)
    assign["config"].update(lr=1e15, steps=4, threads_per_rank=1, timeout_s=15.0)
    try:
        agent._assign(assign)
        [store] = posted
        agent._rendezvous({"run_id": 7, "attempt": 1, "host": "127.0.0.1",
                           "port": store["port"]})
        deadline = time.monotonic() + 120.0
        while not _ends(posted) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        agent._loop.close()
    [end] = _ends(posted)
    assert {k: end.get(k) for k in ("type", "state", "message", "retry")} == {
        "type": "run_state", "state": "failed", "message": "loss is NaN at step 1 (stage 1)",
        "retry": False}


def _ends(posted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [message for message in posted if message.get("state") in ("finished", "failed")]
