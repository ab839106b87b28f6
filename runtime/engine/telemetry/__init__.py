"""What a running job measures: ops, steps and memory as events (``metrics``) on one
clock (``clock``), the measured run in the simulator's terms (``measured``), and per-layer
times (``meter``) made into the observed profile the online planner reads (``observe``)."""
