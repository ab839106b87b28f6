"""Switchable blocks and their activation schedule (models/dynamic.py)."""

import pytest
import torch

from pipestudio.runtime.errors import ModelError
from pipestudio.runtime.models import DynamicSpec, SwitchableBlock, dynamic

TINY = {"layers": 4, "width": 16, "heads": 2, "seq_len": 8, "vocab": 32}


def test_an_inactive_block_is_the_identity_and_keeps_its_parameters() -> None:
    block = SwitchableBlock(16, 2)
    x = torch.randn(2, 8, 16)
    assert not torch.equal(block(x), x)
    before = [p.clone() for p in block.parameters()]
    block.set_active(False)
    assert block(x) is x
    assert all(torch.equal(a, b) for a, b in zip(before, block.parameters(), strict=True))
    block.set_active(True)
    assert not torch.equal(block(x), x)


def test_random_schedule_holds_for_a_phase_then_redraws() -> None:
    spec = dynamic(**TINY, schedule="random", switch_every=3, num_active=2)
    assert isinstance(spec, DynamicSpec) and len(spec.blocks) == 4
    phases = [spec.active_blocks(phase * 3) for phase in range(8)]
    for phase, active in enumerate(phases):
        assert len(active) == 2 and active <= {0, 1, 2, 3}
        assert spec.active_blocks(phase * 3 + 2) == active
    assert len({frozenset(active) for active in phases}) > 1
    again = dynamic(**TINY, schedule="random", switch_every=3, num_active=2)
    assert [again.active_blocks(step) for step in range(24)] == [
        spec.active_blocks(step) for step in range(24)
    ]


def test_grow_schedule_adds_one_block_per_phase() -> None:
    spec = dynamic(**TINY, schedule="grow", switch_every=2, num_active=1)
    assert [spec.active_blocks(step) for step in (0, 1, 2, 4, 6, 100)] == [
        {0},
        {0},
        {0, 1},
        {0, 1, 2},
        {0, 1, 2, 3},
        {0, 1, 2, 3},
    ]


def test_apply_step_switches_blocks_and_training_skips_inactive_ones() -> None:
    spec = dynamic(**TINY, schedule="grow", switch_every=1, num_active=1)
    assert all(block.active for block in spec.blocks)  # a new spec runs the full model
    assert spec.apply_step(1) == {0, 1}
    assert [block.active for block in spec.blocks] == [True, True, False, False]
    inputs, targets = spec.sample(2, 0)
    spec.loss(spec.as_module()(inputs), targets).backward()
    assert all(p.grad is not None for p in spec.blocks[1].parameters())
    assert all(p.grad is None for p in spec.blocks[2].parameters())


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"schedule": "cyclic"}, "schedule 'cyclic' is unknown; expected one of random, grow"),
        ({"switch_every": 0}, "switch_every must be >= 1 step, got 0"),
        ({"num_active": 5}, "num_active must be between 0 and layers \\(4\\), got 5"),
    ],
)
def test_bad_schedules_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ModelError, match=message):
        dynamic(**TINY, **kwargs)  # type: ignore[arg-type]
