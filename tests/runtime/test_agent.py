"""The worker agent's answer to an assignment (pipestudio/runtime/agent/agent.py): a run
whose configuration it refuses fails as the run's own fault, so no attempt resumes it."""

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
