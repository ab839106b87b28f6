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

``interleaved-1f1b`` (Megatron-LM): device d holds chunks d, d + p, ... (v of them). Its
k-th forward is of chunk (k // p) mod v and micro-batch (k // (p v)) p + k mod p: p
micro-batches through its first chunk, the same p through its second, and so on, then the
next p. Backwards go through the chunks in reverse. Device d warms up with
(v - 1) p + 2 (p - 1 - d) forwards, then alternates. Two devices, two chunks each (a, b),
four micro-batches, every cell one chunk's forward or backward::

    interleaved-1f1b
    device 0  Fa0 Fa1 Fb0 Fb1 Fa2 Bb0 Fa3 Bb1 Fb2 Ba0 Fb3 Ba1 .. Bb2 .. Bb3 Ba2 Ba3
    device 1  .. Fa0 Fa1 Fb0 Bb0 Fb1 Bb1 Fa2 Ba0 Fa3 Ba1 Fb2 Bb2 Fb3 Bb3 Ba2 Ba3 ..

With every op the same length the step is (m + (p - 1) / v) times a device's forward plus
backward of one micro-batch: the bubble is (p - 1) / (v m) of the work, 1F1B's over v.

``zero-bubble`` (ZB-H1): 1F1B's forwards and input-gradient backwards (B); each weight-
gradient half (W) runs once stage s has s later backwards done, so stage s has s of them
deferred, and runs the rest at the end. Four stages, eight micro-batches, F, B and W one
cell each::

    zero-bubble
    stage 0  F0 F1 F2 F3 .. .. .. B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7
    stage 1  .. F0 F1 F2 .. .. B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7
    stage 2  .. .. F0 F1 .. B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7
    stage 3  .. .. .. F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7

The step is 3 m + p - 1 cells where 1F1B's (B and W as one backward of two cells) is
3 (m + p - 1): the bubble drops from 3 (p - 1) cells to p - 1. Stage s holds the
activations of at most p - s micro-batches, as in 1F1B, and the inputs that the weight
halves need of s more.
"""

FORWARD = "F"
BACKWARD = "B"
WEIGHT = "W"


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


def interleaved_order(
    device: int, devices: int, chunks: int, microbatches: list[int]
) -> list[tuple[str, int, int]]:
    """(kind, chunk on this device, micro-batch) of device ``device`` of ``devices``, each
    holding ``chunks`` chunks, over ``microbatches`` (a multiple of ``devices``; module
    docstring)."""
    total = len(microbatches) * chunks
    group = devices * chunks

    def which(k: int, backward: bool) -> tuple[int, int]:
        chunk = (k // devices) % chunks
        return (chunks - 1 - chunk if backward else chunk), microbatches[
            (k // group) * devices + k % devices
        ]

    warmup = min((chunks - 1) * devices + 2 * (devices - 1 - device), total)
    order = [(FORWARD, *which(k, False)) for k in range(warmup)]
    for k in range(total - warmup):
        order.append((FORWARD, *which(warmup + k, False)))
        order.append((BACKWARD, *which(k, True)))
    order.extend((BACKWARD, *which(k, True)) for k in range(total - warmup, total))
    return order


def zero_bubble_order(microbatches: list[int], warmup: int, delay: int) -> list[tuple[str, int]]:
    """ZB-H1's order for one stage: 1F1B's, each backward's weight half ``delay``
    backwards later (the rest after the last backward; module docstring)."""
    order: list[tuple[str, int]] = []
    pending: list[int] = []
    for kind, mb in worker_order("1f1b", microbatches, warmup):
        order.append((kind, mb))
        if kind == BACKWARD:
            pending.append(mb)
            if len(pending) > delay:
                order.append((WEIGHT, pending.pop(0)))
    order.extend((WEIGHT, mb) for mb in pending)
    return order
