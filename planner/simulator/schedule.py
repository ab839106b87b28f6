"""The order in which one worker runs its forwards (F) and backwards (B).

Four stages, eight micro-batches, one replica each; time runs to the right and every cell
is one forward or one backward of equal length (``..`` is a bubble)::

    gpipe
    stage 0  F0 F1 F2 F3 F4 F5 F6 F7 .. .. .. .. .. .. B7 B6 B5 B4 B3 B2 B1 B0
    stage 1  .. F0 F1 F2 F3 F4 F5 F6 F7 .. .. .. .. B7 B6 B5 B4 B3 B2 B1 B0 ..
    stage 2  .. .. F0 F1 F2 F3 F4 F5 F6 F7 .. .. B7 B6 B5 B4 B3 B2 B1 B0 .. ..
    stage 3  .. .. .. F0 F1 F2 F3 F4 F5 F6 F7 B7 B6 B5 B4 B3 B2 B1 B0 .. .. ..

    1f1b (and pipedream within one step)
    stage 0  F0 F1 F2 F3 .. .. .. B0 F4 B1 F5 B2 F6 B3 F7 B4 .. B5 .. B6 .. B7
    stage 1  .. F0 F1 F2 .. .. B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 .. B6 .. B7 ..
    stage 2  .. .. F0 F1 .. B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 .. B7 .. ..
    stage 3  .. .. .. F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 .. .. ..

Both take (m + p - 1) cells of forward plus backward; 1F1B holds at most p - s micro-batches
of activations at stage s where GPipe holds all m. ``tests/planner/simulator/test_schedule.py``
simulates these two cases and asserts this same picture.
"""

FORWARD = "F"
BACKWARD = "B"


def worker_order(schedule: str, microbatches: list[int], warmup: int) -> list[tuple[str, int]]:
    """Compute ops of one worker over its ``microbatches`` in the order it runs them.

    ``warmup`` is the number of forwards 1F1B runs before its first backward.
    """
    if schedule == "gpipe":
        return [(FORWARD, mb) for mb in microbatches] + [
            (BACKWARD, mb) for mb in reversed(microbatches)
        ]
    num_warmup = min(warmup, len(microbatches))
    order = [(FORWARD, mb) for mb in microbatches[:num_warmup]]
    for idx in range(len(microbatches) - num_warmup):
        order.append((FORWARD, microbatches[num_warmup + idx]))
        order.append((BACKWARD, microbatches[idx]))
    order.extend((BACKWARD, mb) for mb in microbatches[len(microbatches) - num_warmup :])
    return order
