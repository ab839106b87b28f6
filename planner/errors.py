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


class InfeasibleError(PlannerError):
    """No plan fits device memory.

    ``min_memory_bytes`` is the smallest memory per device at which the planner's plan fits,
    found to within ``precision_bytes`` (``algorithms/min_memory.py``); None where it is not
    known, or where no memory is enough.
    """

    def __init__(
        self, message: str, min_memory_bytes: int | None = None, precision_bytes: int | None = None
    ) -> None:
        super().__init__(message)
        self.min_memory_bytes = min_memory_bytes
        self.precision_bytes = precision_bytes


class WorkBudgetError(PlannerError):
    """A request would cost more work than allowed, so it is refused before it starts: a
    simulation would build more ops (``simulator/budget.py``), or a planner would search more
    (``request.check_request_budget``).

    ``field`` names the input most responsible (``num_microbatches``, ``num_steps``,
    ``num_stages``...), ``limit`` is the most work allowed and ``num_ops`` the estimate,
    in the same unit.
    """

    def __init__(self, message: str, *, field: str, limit: int, num_ops: int) -> None:
        super().__init__(message)
        self.field = field
        self.limit = limit
        self.num_ops = num_ops
