"""The planners, by name: each answers a PlanRequest with a plan and its objective."""

from pipestudio.planner.planners.dawnpiper import dawnpiper
from pipestudio.planner.planners.optimal import optimal
from pipestudio.planner.planners.pipedream import pipedream
from pipestudio.planner.planners.simple import balance_size, balance_time, uniform
from pipestudio.planner.planners.vpipe import vpipe
from pipestudio.planner.request import Planner

PLANNERS: dict[str, Planner] = {
    "uniform": uniform,
    "balance-time": balance_time,
    "balance-size": balance_size,
    "pipedream": pipedream,
    "vpipe": vpipe,
    "dawnpiper": dawnpiper,
    "optimal": optimal,
}
