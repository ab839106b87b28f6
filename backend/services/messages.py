"""What a worker's numbered messages do to the store (``protocol.py``), and what must
follow once they are committed: messages to workers and to dashboards (``Actions``)."""

import math
import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.protocol import METRIC_KINDS
from pipestudio.backend.repositories import Runs

TERMINAL_RUN_STATES = ("finished", "failed", "stopped")


@dataclass
class Actions:
    """Sends to do after the commit: (worker_id, message) and (run_id, message); and the
    connections to close, (worker_id, reason)."""

    to_workers: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    to_watchers: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    to_disconnect: list[tuple[str, str]] = field(default_factory=list)
    #: Metric rows to insert, all at once at the end of the batch.
    metric_rows: list[dict[str, Any]] = field(default_factory=list)

    def extend(self, other: "Actions") -> None:
        self.to_workers += other.to_workers
        self.to_watchers += other.to_watchers
        self.to_disconnect += other.to_disconnect
        self.metric_rows += other.metric_rows


def run_message(run: models.Run, ranks: list[models.RunRank]) -> dict[str, Any]:
    return {
        "type": "run",
        "run": {
            "id": run.id,
            "state": run.state,
            "message": run.message,
            "last_step": run.last_step,
            "attempt": run.attempt,
            "store_address": run.store_address,
            "plan_id": run.plan_id,
            "ranks": [
                {
                    "rank": r.rank,
                    "worker_id": r.worker_id,
                    "stage": r.stage,
                    "replica": r.replica,
                    "state": r.state,
                }
                for r in ranks
            ],
        },
    }


def stop_commands(
    run: models.Run, ranks: list[models.RunRank], reason: str, skip: str | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """Stop the ranks of the run's current attempt (older ones are stopped already)."""
    workers = sorted({r.worker_id for r in ranks} - {skip})
    return [
        (
            worker_id,
            {
                "type": "command",
                "command_id": uuid.uuid4().hex,
                "run_id": run.id,
                "command": "stop",
                "payload": {"reason": reason, "attempt": run.attempt},
            },
        )
        for worker_id in workers
    ]


def may_resume(run: models.Run) -> bool:
    """Whether a failure of the run's current attempt starts another one."""
    settings = run.settings or {}
    return settings.get("on_failure") == "resume" and run.attempt < int(
        settings.get("max_resumes", 0)
    )


def begin_resume(
    session: Session, run: models.Run, reason: str, skip_worker: str | None = None
) -> Actions:
    """Stop the failed attempt's ranks and free their slots: the run waits in ``resuming``
    until the backend's watchdog starts the next attempt (``runs.relaunch``)."""
    ranks = Runs(session).ranks(run.id)
    actions = Actions(to_workers=stop_commands(run, ranks, reason, skip_worker))
    for rank in ranks:
        session.delete(rank)
    run.attempt += 1
    run.state, run.store_address = "resuming", None
    run.message = f"attempt {run.attempt} of {run.settings['max_resumes']} starts: {reason}"
    session.add(
        models.Event(run_id=run.id, kind="resuming", message=reason, data={"attempt": run.attempt})
    )
    session.flush()
    actions.to_watchers.append((run.id, run_message(run, [])))
    return actions


def end_run(
    session: Session,
    run: models.Run,
    state: str,
    message: str | None,
    *,
    skip_worker: str | None = None,
    resume: bool = True,
) -> Actions:
    """Put an active run in a terminal state, record it, tell its workers to stop. A run
    that fails but asked to resume (``may_resume``) goes to ``resuming`` instead, unless
    ``resume`` is false."""
    actions = Actions()
    if run.state in TERMINAL_RUN_STATES:
        return actions
    if state == "failed" and resume and may_resume(run):
        return begin_resume(session, run, message or "failed", skip_worker)
    run.state, run.message, run.ended_at = state, message, models.utcnow()
    session.add(models.Event(run_id=run.id, kind=state, message=message, data={}))
    for proposal in session.scalars(
        select(models.Proposal).where(
            models.Proposal.run_id == run.id, models.Proposal.state == "pending"
        )
    ):
        close_proposal(proposal, f"run {run.id} {state} before anyone decided")
        actions.to_watchers.append((run.id, proposal_message(proposal)))
    ranks = Runs(session).ranks(run.id)
    if state != "finished":
        actions.to_workers += stop_commands(run, ranks, message or state, skip_worker)
    actions.to_watchers.append((run.id, run_message(run, ranks)))
    return actions


def close_proposal(proposal: models.Proposal, outcome: str) -> None:
    """Mark a proposal as one nobody will decide (``ProposalState``), saying why."""
    proposal.state, proposal.outcome, proposal.decided_at = "closed", outcome, models.utcnow()


def proposal_message(proposal: models.Proposal) -> dict[str, Any]:
    """The dashboards' ``proposal`` message for a proposal whose state changed."""
    return {
        "type": "proposal",
        "run_id": proposal.run_id,
        "proposal_id": proposal.id,
        "state": proposal.state,
        "outcome": proposal.outcome,
    }


def metrics_message(run_id: int, events: list[dict[str, Any]], received_s: float) -> dict[str, Any]:
    """The dashboards' ``metrics`` message for a run's metric events."""
    return {"type": "metrics", "run_id": run_id, "received_at": received_s, "events": events}


def metric_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The metric events (``METRIC_KINDS``) of a worker's ``events`` message."""
    return [
        e
        for e in message.get("events", [])
        if isinstance(e, dict) and str(e.get("type", "unknown"))[:20] in METRIC_KINDS
    ]


def _finite_number(value: object) -> float | None:
    """A time for the ``time_ms`` column: NaN and infinities (stored as names in the
    event's data, ``screening.cleaned``) have no place on the time axis."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def apply_events(
    session: Session, worker_id: str, run: models.Run, events: list[dict[str, Any]]
) -> Actions:
    now = models.utcnow()
    metrics: list[dict[str, Any]] = []
    others: list[models.Event] = []
    for event in events:
        kind = str(event.get("type", "unknown"))[:20]
        step = event.get("step")
        if kind in METRIC_KINDS:
            time_ms = _finite_number(event.get("end_ms", event.get("time_ms")))
            metrics.append(
                {
                    "run_id": run.id,
                    "worker_id": worker_id,
                    "kind": kind,
                    "stage": event.get("stage"),
                    "replica": event.get("replica"),
                    "step": step,
                    "time_ms": time_ms,
                    "received_at": now,
                    "data": event,
                }
            )
            if kind == "step" and isinstance(step, int):
                run.last_step = max(step, run.last_step if run.last_step is not None else -1)
        else:
            others.append(
                models.Event(
                    run_id=run.id,
                    worker_id=worker_id,
                    kind=kind,
                    stage=event.get("stage"),
                    step=step,
                    data=event,
                    message=event.get("message"),
                    created_at=now,
                )
            )
            if kind == "start" and run.state == "starting":
                run.state, run.started_at = "running", now
    session.add_all(others)
    actions = Actions(metric_rows=metrics)
    received = now.timestamp()
    if metrics:
        actions.to_watchers.append(
            (run.id, metrics_message(run.id, [m["data"] for m in metrics], received))
        )
    for row in others:
        actions.to_watchers.append(
            (
                run.id,
                {"type": "event", "run_id": run.id, "received_at": received, "event": row.data},
            )
        )
    return actions


def apply_store(session: Session, run: models.Run, host: str, port: int) -> Actions:
    actions = Actions()
    if run.state in (*TERMINAL_RUN_STATES, "resuming"):
        return actions
    run.store_address = f"{host}:{port}"
    ranks = Runs(session).ranks(run.id)
    for worker_id in sorted({r.worker_id for r in ranks}):
        actions.to_workers.append(
            (
                worker_id,
                {
                    "type": "rendezvous",
                    "run_id": run.id,
                    "attempt": run.attempt,
                    "host": host,
                    "port": port,
                },
            )
        )
    actions.to_watchers.append((run.id, run_message(run, ranks)))
    return actions


def apply_run_state(
    session: Session,
    worker_id: str,
    run: models.Run,
    state: str,
    message: str | None,
    *,
    retry: bool = True,
) -> Actions:
    """A worker's ranks of the run's current attempt started or ended (the caller drops
    what an earlier attempt's ranks say); the run ends when one fails or all finish. A
    failure the worker says another attempt would likely repeat (``retry`` false: it
    refused the assignment) fails the run even when it asked to resume."""
    ranks = Runs(session).ranks(run.id)
    for rank in ranks:
        if rank.worker_id == worker_id:
            rank.state = state
    session.flush()
    if state == "failed":
        if run.state == "failed" and message and _names_the_cause(run.message, message):
            # a rank that waited on a failed peer can be reported first, by its own worker;
            # its words end with the peer's, which this report now gives as they are
            run.message = message
            return Actions(to_watchers=[(run.id, run_message(run, ranks))])
        return end_run(
            session,
            run,
            "failed",
            message or f"worker {worker_id} failed",
            skip_worker=worker_id,
            resume=retry,
        )
    if state == "finished" and all(r.state == "finished" for r in ranks):
        return end_run(session, run, "finished", message)
    actions = Actions()
    if state == "running" and run.state == "starting":
        run.state, run.started_at = "running", models.utcnow()
    actions.to_watchers.append((run.id, run_message(run, ranks)))
    return actions


def _names_the_cause(stored: str | None, reported: str) -> bool:
    """Whether ``reported`` is the failure that ``stored`` was reported as the consequence
    of: a rank that fails waiting on a peer says ``<rank> stopped while <what>: <the
    peer's reason>`` (``engine/faults.py``)."""
    return bool(stored and stored != reported and stored.endswith(f": {reported}"))


def worker_label(session: Session, worker_id: str) -> str:
    """A worker as a person knows it: its name (and host), with its id only when there is
    no such worker."""
    worker = session.get(models.Worker, worker_id)
    return worker_id if worker is None else f"{worker.name} on {worker.host}"


def apply_command_result(
    session: Session, worker_id: str, run: models.Run, message: dict[str, Any]
) -> Actions:
    """Record a command's outcome; a migration's decides its proposal."""
    payload = message.get("payload") or {}
    ok = bool(message.get("ok"))
    text = str(message.get("message") or ("done" if ok else "failed"))
    actions = Actions()
    proposal_id = payload.get("proposal_id")
    if message.get("command") == "migrate" and isinstance(proposal_id, int):
        proposal = session.get(models.Proposal, proposal_id)
        if proposal is not None and proposal.state == "approved":
            proposal.state = "applied" if ok else "failed"
            proposal.outcome = f"worker {worker_label(session, worker_id)}: {text}"
            actions.to_watchers.append((run.id, proposal_message(proposal)))
    event = models.Event(
        run_id=run.id,
        worker_id=worker_id,
        kind="migration" if message.get("command") == "migrate" else "command",
        message=text,
        data={k: v for k, v in message.items() if k != "seq"},
    )
    session.add(event)
    actions.to_watchers.append((run.id, {"type": "event", "run_id": run.id, "event": event.data}))
    return actions
