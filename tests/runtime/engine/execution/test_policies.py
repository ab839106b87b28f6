"""Recompute and swap change memory, never results (engine stage.py, swap.py)."""

from pathlib import Path
from typing import Any

import pytest

from tests.runtime.engine.helpers import (
    builder,
    final_params,
    make_plan,
    max_relative_difference,
    run,
)

CASES = {
    # Two-layer recompute run, a swapped layer, a recomputed head that feeds the loss.
    "gpt-1f1b": (
        "gpt",
        "1f1b",
        [["embed", "block0", "block1"], ["head"]],
        {"embed": "swap", "block0": "recompute", "block1": "recompute", "head": "recompute"},
    ),
    # Recomputation on stashed weights: it must replay the forward's version.
    "mlp-pipedream": (
        "mlp",
        "pipedream",
        [["block0"], ["block1"], ["head"]],
        {"block0": "swap", "block1": "recompute", "head": "recompute"},
    ),
    # A recomputed run that reads tensors received over a long skip; ``head`` saves
    # nothing but its input (which stays), so swapping it moves nothing.
    "unet-gpipe": (
        "unet",
        "gpipe",
        [["enc0", "enc1"], ["bottom", "dec1", "dec0", "head"]],
        {
            "enc0": "swap",
            "bottom": "recompute",
            "dec1": "swap",
            "dec0": "recompute",
            "head": "swap",
        },
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_policies_change_nothing(case: str, tmp_path: Path) -> None:
    model, schedule, stages, policies = CASES[case]
    optimizer = "momentum" if model == "gpt" else "adam"
    events: list[dict[str, Any]] = []
    mixed = make_plan(model, stages, schedule, policies=policies, optimizer=optimizer)
    kept = make_plan(model, stages, schedule, optimizer=optimizer)
    result = run(mixed, model, 3, tmp_path / "mixed", events.append)
    assert result.ok, result.message
    assert run(kept, model, 3, tmp_path / "kept").ok
    names = builder(model)().layer_names
    got = final_params(tmp_path / "mixed", mixed, names)
    assert max_relative_difference(got, final_params(tmp_path / "kept", kept, names)) <= 1e-6
    ops = [event for event in events if event["type"] == "op"]
    recomputed = {op["stage"] for op in ops if op["op"] == "recompute"}
    swapped = {
        (op["stage"], op["op"]) for op in ops if op["op"].startswith("swap") and op["bytes"] > 0
    }
    assert recomputed == {
        idx
        for idx, layers in enumerate(stages)
        if any(policies.get(n) == "recompute" for n in layers)
    }
    swap_stages = {
        idx for idx, layers in enumerate(stages) if any(policies.get(n) == "swap" for n in layers)
    }
    assert swapped == {(idx, op) for idx in swap_stages for op in ("swap_out", "swap_in")}
