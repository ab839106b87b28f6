"""A stage's memory subproblem, which layers to keep, recompute or swap: exact
(``exact``), bounded for large stages (``bounded``), and fast seeds (``greedy``)."""
