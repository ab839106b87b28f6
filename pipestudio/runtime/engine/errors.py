"""Errors of the pipeline engine: a user's mistake, and a failure of the distributed job.

``EngineError`` is a bad plan, model or setting; it subclasses the planner's ``PlannerError``
(a ``ValueError``), so the command line reports it in one line with exit status 2, before
any process starts. ``WorkerFailure`` is what a running rank raises when it cannot go on:
a peer died or hung, a wait timed out, or its own computation failed; its message names the
rank at the root of the failure.
"""

from pipestudio.planner.errors import PlannerError


class EngineError(PlannerError):
    """A plan, model or engine setting that cannot be run; the message names the value."""


class WorkerFailure(RuntimeError):
    """A rank of a running job failed; ``root_rank`` is the rank that caused it, if known."""

    def __init__(self, message: str, root_rank: int | None = None) -> None:
        super().__init__(message)
        self.root_rank = root_rank
