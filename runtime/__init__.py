"""Runtime: runs plans on PyTorch.

The profiler, built-in models, the pipeline engine on torch.distributed, schedules,
recompute and swap, live migration, checkpoints and the worker agent live here. It imports
the planner (formats, schedules) and never the backend or the dashboard.
"""
