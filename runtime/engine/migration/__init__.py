"""Live migration: moving layers between the stages of a running job without restarting it.

``settings`` (what a job may migrate, scripted moves, checked new plans); ``commands`` (the
command channel a person or the backend writes to); ``coordinator`` (rank 0's decisions
and what every rank follows), with ``intake`` (commands and held proposals), ``online``
(the online planner's evaluations) and ``record`` (what a checkpoint keeps to resume);
``executor`` (one rank's part: its partitions over micro-batches and the state it moves),
``switch`` (which partition runs each micro-batch, and the weight versions that move) and
``wire`` (layer state on the wire between two ranks). docs/runtime.md describes it."""
