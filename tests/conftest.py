"""Shared fixtures: where the real PipeDream profiles live."""

from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIPEDREAM_DIR = ROOT / "profiles" / "pipedream"
PIPEDREAM_MODELS = sorted(p.name for p in PIPEDREAM_DIR.iterdir() if p.is_dir())


@pytest.fixture
def pipedream_graph() -> Path:
    return PIPEDREAM_DIR / "vgg16" / "graph.txt"


#: Tests that start training processes (ranks, workers, the demo, namespace hosts): under
#: xdist they share one group, so that no two of them compete for the cores at once.
PROCESS_TESTS = (
    "tests/runtime/engine/",
    "tests/runtime/agent/",
    "tests/runtime/test_agent.py",
    "tests/multihost/",
    "tests/deploy/",
    "tests/cli/",
)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist's ``--dist loadfile`` (``make test``: ``-n 2``): a file's tests
    run on one worker in their order (module fixtures; browser tests that go on from the
    one before), and the tests of ``PROCESS_TESTS`` all on one worker, one at a time."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return "processes" if path.startswith(PROCESS_TESTS) else path

    return Scheduling(config, log)
