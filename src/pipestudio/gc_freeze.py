"""Short full collections in long-lived processes: the backend, the worker agent, a rank.

CPython's collector walks every tracked object in a full (generation 2) collection. After
``import torch`` (and Dash in the backend) that is 200,000 to 300,000 objects, about
0.1-0.2 s a walk on a loaded machine: a stall of every request and stream in the backend,
and of the whole pipeline in a rank (measured in both; docs/backend.md, docs/runtime.md).
Those objects (modules, classes, functions, the model) live as long as the process, so
``settle_heap`` collects what is garbage now and moves everything left into the permanent
generation, which collections skip. Objects made afterwards are collected as before; a
settled object that later becomes cyclic garbage is never freed, so settle once setup is
done, not in a loop.
"""

import gc


def settle_heap() -> None:
    """Collect now, then keep every surviving object out of later collections."""
    gc.collect()
    gc.freeze()
