"""``pipedream``: PipeDream's optimizer (SOSP'19 §3.1): ``planner`` (the planner), ``dp``
(its hierarchical dynamic program, evaluated exactly) over ``antichains`` (the antichain DAG
of a layer graph), with the exact pruning that keeps it fast: ``bounds`` (lower bounds),
``order`` (the scan order) and ``reach`` (refusals by reach).
"""
