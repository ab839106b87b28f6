"""Errors of the pipeline engine: a user's mistake, and a failure of the distributed job.

``EngineError`` is a bad plan, model or setting; it subclasses the planner's ``PlannerError``
(a ``ValueError``), so the command line reports it in one line with exit status 2, before
any process starts. ``WorkerFailure`` is what a running rank raises when it cannot go on:
a peer died or hung, a wait timed out, or its own computation failed; its message names the
rank at the root of the failure. ``NonFiniteLoss`` is the root of a failure that another
attempt, resumed from a checkpoint, would meet again: the training itself diverged.
"""

import math

from pipestudio.planner.errors import PlannerError


class EngineError(PlannerError):
    """A plan, model or engine setting that cannot be run; the message names the value."""


class WorkerFailure(RuntimeError):
    """A rank of a running job failed; ``root_rank`` is the rank that caused it, if known.
    ``retry`` is false when the root's failure is deterministic (``NonFiniteLoss``);
    ``cause`` names such a failure on the rank where it happened."""

    cause: str | None = None

    def __init__(self, message: str, root_rank: int | None = None, *, retry: bool = True) -> None:
        super().__init__(message)
        self.root_rank = root_rank
        self.retry = retry


class NonFiniteLoss(WorkerFailure):
    """The loss of ``step`` computed by stage ``stage_idx`` (on ``rank``) is NaN or ±inf."""

    cause = "nonfinite_loss"

    def __init__(self, loss: float, step: int, stage_idx: int, rank: int) -> None:
        assert not math.isfinite(loss)
        name = "NaN" if math.isnan(loss) else ("inf" if loss > 0 else "-inf")
        super().__init__(f"loss is {name} at step {step} (stage {stage_idx})", rank, retry=False)
