"""``pipedream``: PipeDream's optimizer: the planner, its hierarchical dynamic program
(``dp``) over the antichain DAG (``antichains``), and the exact pruning that keeps it fast
(``bounds``, ``order``, ``reach``)."""
