"""The schedule diagrams in planner/simulator/schedule.py are what the simulator does."""

import pytest

from pipestudio.planner import simulate
from pipestudio.planner.simulator import schedule
from pipestudio.planner.simulator.schedule import worker_order
from tests.planner.helpers import chain_profile, even_plan


def render(schedule_name: str, num_stages: int = 4, num_mb: int = 8) -> list[str]:
    """One row per stage, one cell per time unit (forward = backward = 1 ms)."""
    profile = chain_profile(num_stages, fwd_ms=1.0, bwd_ms=1.0)
    result = simulate(profile, even_plan(profile, num_stages, num_mb, schedule_name))
    cells = [[".."] * round(result.step_time_ms) for _ in range(num_stages)]
    for op in result.timeline:
        if op.op in ("forward", "backward"):
            cells[op.stage][round(op.start_ms)] = op.op[0].upper() + str(op.microbatch)
    return [f"stage {idx}  " + " ".join(row) for idx, row in enumerate(cells)]


def docstring_block(title: str) -> list[str]:
    lines = [line.strip() for line in (schedule.__doc__ or "").splitlines()]
    start = next(idx for idx, line in enumerate(lines) if line.startswith(title))
    return lines[start + 1 : start + 5]


@pytest.mark.parametrize("name,title", [("gpipe", "gpipe"), ("1f1b", "1f1b (and pipedream")])
def test_docstring_diagram_matches_simulation(name: str, title: str) -> None:
    assert render(name) == docstring_block(title)


def test_1f1b_order_warmup_steady_drain() -> None:
    assert worker_order("1f1b", [0, 1, 2, 3], 2) == [
        ("F", 0),
        ("F", 1),
        ("F", 2),
        ("B", 0),
        ("F", 3),
        ("B", 1),
        ("B", 2),
        ("B", 3),
    ]
    assert worker_order("1f1b", [0, 1], 5) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert worker_order("gpipe", [0, 1, 2], 0) == [
        ("F", 0),
        ("F", 1),
        ("F", 2),
        ("B", 2),
        ("B", 1),
        ("B", 0),
    ]


def test_warmup_counts_follow_pipedream_runtime() -> None:
    """(workers in this and later stages - 1) // replicas of this stage."""
    profile = chain_profile(4)
    plan = even_plan(profile, 3, 4, "pipedream", replicas=[2, 1, 1])
    assert [plan.warmup_forwards(s) for s in range(3)] == [(4 - 1) // 2, 1, 0]
