"""The planners' cost model: ``stage`` (a stage's time per micro-batch and peak memory),
``chain`` (O(1) sums over a chain, each stage's subproblem), ``partition`` (cut points
scored stage by stage), ``rangemax`` (range maximum queries), ``coarsen`` (a graph planned
on its sequential backbone) and ``memopt/`` (the memory subproblem: which layers to keep,
recompute or swap). docs/planners.md describes it.
"""
