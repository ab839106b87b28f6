"""A stage's micro-batch data, made while the rank waits for a peer.

The first stage reads each micro-batch's inputs and the stage with the loss its targets;
``ModelSpec.sample`` makes both, and on a CPU it is not free (the built-in ``mlp`` draws
32 x 512 inputs and labels them with a 512 x 512 teacher: about 0.25 ms timed alone here,
against 1.2 to 1.7 ms for the forward of half the model). Made when the forward starts, it
sits between two ops on the critical path. The worker instead names the next forward's
micro-batch as soon as it knows it (``want``), and when it is about to wait for a peer's
tensor that has not come, it makes the wanted data first (``while_waiting``): the time
goes into the wait, on the rank's own thread. ``sample`` depends on the seed and the index
alone (the model contract, docs/runtime.md), so when it runs changes no number. Making it
in a background thread instead was tried first: it made the steps of ``mlp`` at 2 stages
and 2 micro-batches 23% to 39% slower on a 2-core machine.
"""

from collections.abc import Callable

from torch import Tensor

Sampler = Callable[[int, int], tuple[Tensor, Tensor]]

#: Micro-batches whose data may be wanted, or made and waiting, at once.
MAX_AHEAD = 2


class DataAhead:
    """Micro-batches' data by index, made in waits (module docstring)."""

    def __init__(self, sample: Sampler, microbatch_size: int) -> None:
        self._sample, self._size = sample, microbatch_size
        self._wanted: list[int] = []
        self._made: dict[int, tuple[Tensor, Tensor]] = {}

    def want(self, microbatch: int) -> None:
        """Note that a forward of ``microbatch`` that reads data comes (nothing when it is
        noted or made already, or ``MAX_AHEAD`` are)."""
        if microbatch in self._made or microbatch in self._wanted:
            return
        if len(self._made) + len(self._wanted) < MAX_AHEAD:
            self._wanted.append(microbatch)

    def while_waiting(self, arrived: Callable[[], bool]) -> None:
        """Make the wanted data, the earliest first, until ``arrived()`` says what the
        rank waits for is here."""
        while self._wanted and not arrived():
            microbatch = self._wanted.pop(0)
            self._made[microbatch] = self._sample(self._size, microbatch)

    def take(self, microbatch: int) -> tuple[Tensor, Tensor]:
        """``microbatch``'s inputs and targets: made in a wait, or made now."""
        if microbatch in self._wanted:
            self._wanted.remove(microbatch)
        made = self._made.pop(microbatch, None)
        return self._sample(self._size, microbatch) if made is None else made
