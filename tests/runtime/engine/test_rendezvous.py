"""Starting and joining: children never start by a plain fork; ranks wait for each other to
start, and a rank that never starts is named."""

from datetime import timedelta

import pytest
import torch.distributed as dist

from pipestudio.runtime.engine import EngineConfig, launch
from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.rendezvous import JOIN_TIMEOUT_S, _arrive, join_timeout_s
from tests.runtime.engine.helpers import make_plan, model_args


def test_a_rank_that_never_starts_is_named() -> None:
    store = dist.TCPStore(
        "127.0.0.1", 0, 3, True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )
    store.set("arrived/2", "1")  # rank 2 is up, rank 1 never comes
    with pytest.raises(EngineError, match=r"rank 0: rank\(s\) \[1\] did not start within 1 s"):
        _arrive(store, 0, 3, 1.0)


def test_ranks_that_all_arrive_go_on() -> None:
    store = dist.TCPStore(
        "127.0.0.1", 0, 2, True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )
    store.set("arrived/1", "1")
    _arrive(store, 0, 2, 1.0)


def test_joining_waits_longer_than_an_op() -> None:
    assert join_timeout_s(20.0) == JOIN_TIMEOUT_S > 20.0
    assert join_timeout_s(600.0) == 600.0


def test_a_plain_fork_is_refused_before_anything_starts() -> None:
    config = EngineConfig(
        plan=make_plan("mlp", [["block0", "block1"], ["head"]], "1f1b"),
        model="mlp",
        model_args=model_args("mlp"),
        steps=1,
    )
    with pytest.raises(EngineError, match=r"start method 'fork' is not one of"):
        launch(config, start_method="fork")
