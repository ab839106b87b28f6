"""The planning algorithms, and ``PLANNERS``, the registry of the planners by name.

Each planner answers a ``PlanRequest`` (``request``) with a plan and its objective:
``balance`` (uniform, balance-time, balance-size, on ``blockpartition``), ``pipedream/``,
``vpipe``, ``dawnpiper`` and ``optimal/``. ``min_memory`` and ``maxbatch`` search over a
planner's answers (the least device memory, the largest micro-batch); ``schedules`` runs
a planner's splits with every synchronous schedule (``--schedule auto``). docs/planners.md
describes each; docs/architecture.md maps the package.
"""

from pipestudio.planner.algorithms import balance, dawnpiper, vpipe
from pipestudio.planner.algorithms.optimal import planner as optimal_planner
from pipestudio.planner.algorithms.pipedream import planner as pipedream_planner
from pipestudio.planner.algorithms.request import Planner

PLANNERS: dict[str, Planner] = {
    "uniform": balance.uniform,
    "balance-time": balance.balance_time,
    "balance-size": balance.balance_size,
    "pipedream": pipedream_planner.pipedream,
    "vpipe": vpipe.vpipe,
    "dawnpiper": dawnpiper.dawnpiper,
    "optimal": optimal_planner.optimal,
}
