"""``optimal``: the exact planner: a dynamic program over devices and prefixes
(``program``) within the memory band (``band``), pruned by a lower bound (``bound``), then
the simulator's judgement of the finalists (``refine``, ``policies``)."""
