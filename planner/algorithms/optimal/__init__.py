"""``optimal``: the exact planner: ``planner`` (the planner and what it proves), ``program``
(a dynamic program over devices and chain prefixes) within ``band`` (the prefixes the
devices can hold), pruned by ``bound`` (a lower bound on the simulated step), then
``refine`` (the simulator's judgement of the finalists) and ``policies`` (every
keep/recompute/swap policy of a split). docs/planners.md says what is proven.
"""
