"""Errors the runtime raises for a user's mistakes; each names the bad value.

They subclass the planner's ``PlannerError`` (a ``ValueError``) so that the command line and
the API report them the same way as a bad profile or plan: one line, exit status 2 or 422.
"""

from pipestudio.planner.errors import PlannerError


class ModelError(PlannerError):
    """A model name, factory, factory argument or model spec is wrong."""


class DeviceError(PlannerError):
    """The requested device does not exist or is not available on this machine."""


class SettingsError(PlannerError):
    """A runtime setting is out of range or unknown: micro-batch size, repeats, optimizer..."""
