"""A stage's memory subproblem, which layers to keep, recompute or swap: ``exact`` (the
optimum), ``bounded`` (large stages: a fast choice and a proven lower bound) and ``greedy``
(fast seeds for both).
"""
