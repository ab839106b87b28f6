"""A stage's data made while the rank waits (``runtime/engine/execution/data.py``)."""

import pytest
import torch

from pipestudio.runtime.engine.execution.data import MAX_AHEAD, DataAhead
from pipestudio.runtime.models import sample_generator


class Recording:
    """A sampler that notes the micro-batches it made, in order."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.made: list[int] = []
        self.fail_at = fail_at

    def __call__(self, size: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.made.append(index)
        if index == self.fail_at:
            raise ValueError(f"no data for micro-batch {index}")
        x = torch.randn(size, 3, generator=sample_generator(0, index))
        return x, x.sum(1)


def test_wanted_data_is_made_in_a_wait_and_equals_data_made_now() -> None:
    sampler = Recording()
    data = DataAhead(sampler, 4)
    data.want(7)
    data.while_waiting(lambda: False)  # the peer's tensor has not come
    assert sampler.made == [7]
    made = data.take(7)
    assert sampler.made == [7]  # taken, not made again
    now = sampler(4, 7)
    assert torch.equal(made[0], now[0]) and torch.equal(made[1], now[1])


def test_nothing_is_made_when_the_tensor_is_already_there() -> None:
    sampler = Recording()
    data = DataAhead(sampler, 4)
    data.want(1)
    data.while_waiting(lambda: True)
    assert sampler.made == []
    data.take(1)  # made now, once
    assert sampler.made == [1]
    data.while_waiting(lambda: False)  # no longer wanted
    assert sampler.made == [1]


def test_a_wait_makes_the_earliest_wanted_until_the_tensor_comes() -> None:
    sampler = Recording()
    data = DataAhead(sampler, 2)
    for index in range(MAX_AHEAD + 2):
        data.want(index)
    arrivals = iter([False, True])
    data.while_waiting(lambda: next(arrivals))
    assert sampler.made == [0]  # one made, then the tensor was there
    data.while_waiting(lambda: False)
    assert sampler.made == list(range(MAX_AHEAD))  # at most MAX_AHEAD wanted at once
    data.want(MAX_AHEAD)  # both made and waiting: no room
    data.while_waiting(lambda: False)
    assert sampler.made == list(range(MAX_AHEAD))
    data.take(0)
    data.want(MAX_AHEAD)
    data.while_waiting(lambda: False)
    assert sampler.made == [*range(MAX_AHEAD), MAX_AHEAD]


def test_an_error_of_sample_is_raised_in_the_wait() -> None:
    data = DataAhead(Recording(fail_at=3), 2)
    data.want(3)
    with pytest.raises(ValueError, match="no data for micro-batch 3"):
        data.while_waiting(lambda: False)
