"""Proposals: the online planner's repartitions of a running job, approved or rejected.

A proposal is made from an observed profile (``planner.replan.evaluate_replan`` on the
run's plan and cluster) or received whole. Approval sends a ``migrate`` command with the
new plan and the moves to the worker holding rank 0, whose engine coordinates every
migration (``runtime/engine/migration/coordinator.py``); its answer decides whether the
proposal was ``applied`` or ``failed`` (``messages.apply_command_result``), and the engine's own
``migration`` events record each rank's part.

Proposals also come by themselves (``auto_propose``, run by the backend every
``PIPESTUDIO_AUTO_PROPOSE_EVERY_S``): when a running job's measured step drifts from its
plan's prediction by more than ``PIPESTUDIO_AUTO_PROPOSE_DRIFT``, the online planner is
given the run's calibrated profile, and a repartition worth making is stored as a pending
proposal by ``auto`` for a person to approve; never while another waits, and never the
same moves again once a person rejected them.
"""

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.errors import ConflictError, InputError
from pipestudio.backend.repositories import Plans, Proposals, Runs
from pipestudio.backend.schemas.proposals import (
    AnyProposalCreate,
    ObservedProfile,
    ProposalDocument,
)
from pipestudio.backend.services.calibration import calibrated, current_plan
from pipestudio.backend.services.messages import (
    TERMINAL_RUN_STATES,
    close_proposal,
    worker_label,
)
from pipestudio.backend.services.plans import documents
from pipestudio.backend.services.runs import Send, command
from pipestudio.planner import Cluster, PlannerError, Profile
from pipestudio.planner.formats.proposal import Proposal
from pipestudio.planner.replan.online import evaluate_replan


def _evaluate(session: Session, run: models.Run, data: AnyProposalCreate) -> Proposal:
    plan_row = Plans(session).get(run.plan_id)
    plan = current_plan(session, run)
    if isinstance(data, ProposalDocument):
        proposal = data.proposal
        if proposal.model != plan.model:
            raise InputError(
                "proposal",
                f"the proposal is for model {proposal.model!r} but "
                f"run {run.id} trains {plan.model!r}",
            )
        return proposal
    cluster = (
        data.cluster
        if data.cluster is not None
        else documents(session, plan_row.profile_id, plan_row.cluster_id)[1]
    )
    try:
        return evaluate_replan(
            plan,
            data.observed_profile,
            cluster,
            payback_steps=data.payback_steps,
            min_gain_fraction=data.min_gain_fraction,
        )
    except PlannerError as exc:
        raise InputError("observed_profile", str(exc)) from None


#: Steps a drift is measured over (the calibration's window).
AUTO_WINDOW = 20


def auto_propose(
    session: Session, run: models.Run, drift: float, max_ops: int | None = None
) -> models.Proposal | None:
    """A proposal for running job ``run`` when its step drifted from the prediction (module
    docstring); None when none is due or none is worth making."""
    if run.state != "running":
        return None
    earlier = session.scalars(select(models.Proposal).where(models.Proposal.run_id == run.id)).all()
    if any(row.state in ("pending", "approved") for row in earlier):
        return None
    try:
        report = calibrated(session, run.id, AUTO_WINDOW, max_ops)
    except (ConflictError, InputError, ValueError):
        return None  # not enough measured yet
    measured, predicted = report["step_ms"]["measured"], report["step_ms"]["predicted"]
    if not measured or not predicted or abs(measured / predicted - 1) <= drift:
        return None
    observed = ObservedProfile(
        run_id=run.id,
        observed_profile=Profile.model_validate(report["profile"]),
        cluster=None if report["cluster"] is None else Cluster.model_validate(report["cluster"]),
        author="auto",
    )
    try:
        proposal = _evaluate(session, run, observed)
    except InputError:
        return None
    rejected = [row.document.get("moves") for row in earlier if row.state == "rejected"]
    moves = proposal.model_dump(mode="json")["moves"]
    if not proposal.worthwhile or not moves or moves in rejected:
        return None
    return Proposals(session).add(
        models.Proposal(
            run_id=run.id,
            state="pending",
            document=proposal.model_dump(mode="json"),
            worthwhile=True,
            gain_ms=proposal.gain_ms,
            created_by="auto",
        )
    )


def create_proposal(session: Session, data: AnyProposalCreate) -> models.Proposal:
    run = Runs(session).get(data.run_id)
    if run.state in TERMINAL_RUN_STATES:
        raise ConflictError(
            f"run {run.id} is {run.state}: a proposal moves layers of a "
            "running job, and this one will not run again"
        )
    proposal = _evaluate(session, run, data)
    row = models.Proposal(
        run_id=run.id,
        state="pending",
        document=proposal.model_dump(mode="json"),
        worthwhile=proposal.worthwhile,
        gain_ms=proposal.gain_ms,
        created_by=data.author,
    )
    if not proposal.moves and not proposal.policy_changes:
        close_proposal(row, f"changes nothing: {proposal.reason}")
    return Proposals(session).add(row)


def _pending(session: Session, proposal_id: int) -> models.Proposal:
    row = Proposals(session).get(proposal_id, for_update=True)
    if row.state != "pending":
        raise ConflictError(f"proposal {proposal_id} is already {row.state}")
    return row


def reject(session: Session, proposal_id: int, author: str) -> models.Proposal:
    row = _pending(session, proposal_id)
    row.state, row.decided_by, row.decided_at = "rejected", author, models.utcnow()
    return row


def approve(session: Session, proposal_id: int, author: str, send: Send) -> models.Proposal:
    """Approve and send the migration to rank 0's worker (the run must be running)."""
    row = _pending(session, proposal_id)
    run = Runs(session).get(row.run_id)
    if run.state != "running":
        raise ConflictError(f"run {run.id} is {run.state}; only a running job migrates")
    if not row.document.get("moves") and not row.document.get("policy_changes"):
        raise ConflictError(f"proposal {proposal_id} changes nothing")
    row.state, row.decided_by, row.decided_at = "approved", author, models.utcnow()
    payload: dict[str, Any] = {
        "proposal_id": row.id,
        "new_plan": row.document["new_plan"],
        "moves": row.document["moves"],
        "policy_changes": row.document["policy_changes"],
    }
    session.add(
        models.Event(
            run_id=run.id,
            kind="migration_requested",
            data=payload,
            message=f"proposal {row.id} approved by {author}",
        )
    )
    session.commit()
    coordinator = Runs(session).ranks(run.id)[0].worker_id
    if not send(coordinator, command(run, "migrate", payload)):
        row.state = "failed"
        row.outcome = f"worker {worker_label(session, coordinator)} (rank 0) could not be reached"
        session.commit()
    return row
