"""Block partition of a sequence (Bárány, Grinberg: "Block partitions of sequences",
Israel J. Math. 2015, arXiv:1308.2452), as torchgpipe balances a model by time or size.

The values are first normalized to [0, 1]. Starting from equal-length blocks, the
algorithm repeatedly takes a largest block B_p and a smallest block B_q (the first one),
and moves one element from the neighbour of B_q on the side of B_p into B_q, until the
largest block exceeds the smallest by at most 1 (one normalized element). The result is
not always the partition with the smallest largest block; it is what torchgpipe returns.
A move that would leave a block empty ends the search instead (with as many blocks as
elements every block is one element long, and rounding could otherwise loop forever).
"""


def block_partition(values: list[float], num_blocks: int) -> list[int]:
    """Block boundaries: the end index (exclusive) of each block."""
    count = len(values)
    assert 1 <= num_blocks <= count, (num_blocks, count)
    low, high = min(values), max(values)
    spread = high - low
    normal = [0.0] * count if spread == 0 else [(v - low) / spread for v in values]
    prefix = [0.0]
    for value in normal:
        prefix.append(prefix[-1] + value)
    ends = [count // num_blocks * (idx + 1) for idx in range(num_blocks - 1)] + [count]

    def size(block: int) -> float:
        start = ends[block - 1] if block > 0 else 0
        return prefix[ends[block]] - prefix[start]

    def largest() -> tuple[float, int]:
        return max((size(block), block) for block in range(num_blocks))

    def smallest() -> tuple[float, int]:
        return min((size(block), block) for block in range(num_blocks))

    def length(block: int) -> int:
        return ends[block] - (ends[block - 1] if block > 0 else 0)

    while True:
        big, p = largest()
        while True:
            small, q = smallest()
            if big <= small + 1 + 1e-9:  # the slack absorbs rounding of the prefix sums
                return ends
            h = q - 1 if p < q else q + 1  # the neighbour of q on the side of p
            if length(h) == 1:
                return ends  # it would be left empty: no block may be
            if p < q:  # take the last element of the block before q
                ends[h] -= 1
            else:  # take the first element of the block after q
                ends[q] += 1
            if p == h:
                break
