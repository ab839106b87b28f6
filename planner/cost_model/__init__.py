"""The planners' cost model: a stage's time and memory, O(1) sums over a chain, cut
points scored stage by stage, the sequential backbone of a graph, and the memory
subproblem (``memopt/``)."""
