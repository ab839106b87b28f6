"""Planning: the formats, the schedule simulator, the cost model, the planners and the
online replanning.

``formats/`` (Profile, Cluster, Plan, SimResult, Proposal and their machinery),
``simulator/`` (the discrete-event simulator and what feeds it), ``cost_model/`` (the
planners' stage and chain model, and the memory subproblem), ``algorithms/`` (the planners
and their registry ``PLANNERS``), ``replan/`` (whether and how to migrate a running job);
``errors.py`` and ``units.py`` serve them all. This module re-exports what most callers
need. docs/architecture.md maps the code; docs/planners.md describes the planners.

Pure Python: this package imports no torch and no web or database package, so the backend,
the dashboard and scripts can use it anywhere (a test enforces it).
"""

from pipestudio.planner.errors import (
    ClusterError,
    ImportFormatError,
    InfeasibleError,
    PlanError,
    PlannerError,
    ProfileError,
    WorkBudgetError,
)
from pipestudio.planner.formats.cluster import Cluster, Device, Level, cluster_template
from pipestudio.planner.formats.documents import DocumentError, load_document, parse_document
from pipestudio.planner.formats.pipedream import import_pipedream, parse_pipedream
from pipestudio.planner.formats.plan import Plan, Stage, plan_template, resolve_plan
from pipestudio.planner.formats.profile import Edge, Layer, Profile
from pipestudio.planner.formats.result import SimResult
from pipestudio.planner.simulator.budget import DEFAULT_MAX_SIMULATED_OPS
from pipestudio.planner.simulator.simulate import simulate
from pipestudio.planner.simulator.trace import chrome_trace, write_chrome_trace

__all__ = [
    "DEFAULT_MAX_SIMULATED_OPS",
    "Cluster",
    "ClusterError",
    "Device",
    "DocumentError",
    "Edge",
    "ImportFormatError",
    "InfeasibleError",
    "Layer",
    "Level",
    "Plan",
    "PlanError",
    "PlannerError",
    "Profile",
    "ProfileError",
    "SimResult",
    "Stage",
    "WorkBudgetError",
    "chrome_trace",
    "cluster_template",
    "import_pipedream",
    "load_document",
    "parse_document",
    "parse_pipedream",
    "plan_template",
    "resolve_plan",
    "simulate",
    "write_chrome_trace",
]
