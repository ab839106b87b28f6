"""Runtime: runs plans on PyTorch.

The profiler, built-in models, the pipeline engine on torch.distributed, schedules,
recompute and swap, live migration, checkpoints and the worker agent live here. It imports
the planner (formats, schedules) and never the backend or the dashboard.

``models/`` (the built-in models and the model contract), ``profiler.py`` (with
``fx_ops.py`` and ``profiler_ops.py`` for operator-level profiles), ``engine/`` (the
pipeline engine: execution, telemetry, migration), ``agent/`` (the worker agent).
docs/architecture.md maps the code; docs/runtime.md describes it.
"""
