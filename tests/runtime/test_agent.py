"""The worker agent's answer to an assignment (runtime/agent/agent.py): a run
whose configuration it refuses, or whose loss becomes non-finite, fails as the run's own
fault, so no attempt resumes it."""

import asyncio
import time
from typing import Any

from pipestudio.runtime.agent.agent import Agent, _host_ranks
from pipestudio.runtime.agent.ranks import RankGroup, open_store
from pipestudio.runtime.engine import EngineConfig
from pipestudio.runtime.engine.rank import host_cores
from pipestudio.runtime.engine.rendezvous import StoreAddress
from tests.runtime.engine.helpers import make_plan

TINY_MLP = {"layers": "2", "width": "8", "in_features": "4", "out_features": "3"}


def _assign(stages: list[list[str]]) -> dict[str, Any]:
    plan = make_plan("mlp", stages, "1f1b")
    return {
        "type": "assign",
        "run_id": 7,
        "attempt": 1,
        "world_size": 2,
        "ranks": [{"rank": 0, "stage": 0, "replica": 0}],
        "open_store": False,
        "config": {
            "plan": plan.model_dump(mode="json"),
            "model": "mlp",
            "model_args": TINY_MLP,
            "steps": 3,
            "device": "cpu",
        },
    }


def test_a_refused_configuration_is_reported_as_not_worth_retrying() -> None:
    agent = Agent("http://127.0.0.1:9", "token", name="w0", device="cpu")  # never dials
    posted: list[dict[str, Any]] = []
    agent._post = posted.append  # type: ignore[method-assign]

    agent._assign(_assign([["block0", "block1"], ["head"]]))
    assert posted == [] and (7, 1) in agent.assignments

    agent._assign(_assign([["block0", "block9"], ["head"]]))
    [state] = posted
    assert {k: state[k] for k in ("type", "run_id", "attempt", "state", "retry")} == {
        "type": "run_state",
        "run_id": 7,
        "attempt": 1,
        "state": "failed",
        "retry": False,
    }
    assert state["message"].startswith("worker w0: ") and "'block9'" in state["message"]
    assert (7, 1) not in agent.assignments


def test_a_nonfinite_loss_fails_the_run_as_not_worth_retrying() -> None:
    agent = Agent("http://127.0.0.1:9", "token", name="w0", device="cpu")  # never dials
    posted: list[dict[str, Any]] = []
    agent._post = posted.append  # type: ignore[method-assign]
    agent._loop = asyncio.new_event_loop()  # takes the events, never runs
    assign = _assign([["block0", "block1"], ["head"]])
    assign.update(
        ranks=[{"rank": 0, "stage": 0, "replica": 0}, {"rank": 1, "stage": 1, "replica": 0}],
        open_store=True,
    )
    assign["config"].update(lr=1e15, steps=4, threads_per_rank=1, timeout_s=15.0)
    try:
        agent._assign(assign)
        [store] = posted
        agent._rendezvous({"run_id": 7, "attempt": 1, "host": "127.0.0.1", "port": store["port"]})
        deadline = time.monotonic() + 120.0
        while not _ends(posted) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        agent._loop.close()
    [end] = _ends(posted)
    assert {k: end.get(k) for k in ("type", "state", "message", "retry")} == {
        "type": "run_state",
        "state": "failed",
        "message": "loss is NaN at step 1 (stage 1)",
        "retry": False,
    }


def _ends(posted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [message for message in posted if message.get("state") in ("finished", "failed")]


def test_host_ranks_is_a_count_or_ignored() -> None:
    assert _host_ranks({"host_ranks": 3}) == 3
    for hostile in (0, -1, 10**9, True, "2", 2.5, None):
        assert _host_ranks({"host_ranks": hostile}) is None
    assert _host_ranks({}) is None


def test_a_rank_shares_the_host_with_the_run_s_other_ranks() -> None:
    """A one-rank group told that the run has two ranks on this host gives its rank half the
    cores (and never fewer threads than one); told nothing, all of them."""
    plan = make_plan("mlp", [["block0", "block1", "head"]], "1f1b")
    config = EngineConfig(plan=plan, model="mlp", model_args=TINY_MLP, steps=1, timeout_s=30.0)
    threads = {}
    for host_ranks in (2, None):
        store = open_store(1, 30.0)
        events: list[dict[str, Any]] = []
        ended: list[str] = []
        group = RankGroup(
            1,
            config,
            [0],
            StoreAddress("127.0.0.1", store.port),
            events.append,
            lambda state, text, retry, ended=ended: ended.append(state),
            host_ranks=host_ranks,
        )
        group.start()
        deadline = time.monotonic() + 120.0
        while not ended and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ended == ["finished"], events
        [start] = [event for event in events if event["type"] == "start"]
        threads[host_ranks] = start["threads"]
    assert threads == {2: max(1, host_cores() // 2), None: host_cores()}
