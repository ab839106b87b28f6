"""Errors the planner raises for a user's mistakes; each names the bad value."""


class PlannerError(ValueError):
    """Base of every error caused by bad input to the planner (the API maps it to 422)."""


class ProfileError(PlannerError):
    """A profile is inconsistent: a negative size, a duplicate layer name, a cycle..."""


class ClusterError(PlannerError):
    """A cluster description is inconsistent or too small for a plan."""


class PlanError(PlannerError):
    """A plan does not fit its profile: an unknown layer, overlapping stages..."""


class ImportFormatError(PlannerError):
    """A foreign profile file (PipeDream's graph.txt) could not be read."""
