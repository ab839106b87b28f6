"""Medians after warm-up, with untimed preparation (timing.py)."""

import torch

from pipestudio.runtime.timing import median_ms


def test_prepare_runs_before_every_run_and_is_not_timed() -> None:
    calls: list[str] = []

    def prepare() -> int:
        calls.append("prepare")
        return len(calls)

    def run(arg: int) -> None:
        calls.append(f"run {arg}")

    result = median_ms(run, prepare, torch.device("cpu"), warmup=1, repeats=3)
    assert result >= 0
    assert calls == ["prepare", "run 1", "prepare", "run 3", "prepare", "run 5", "prepare", "run 7"]
