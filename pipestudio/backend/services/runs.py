"""Runs: launching an approved plan on registered workers, stopping, and reading back.

Ranks go stage by stage (stage 0's replicas first, as the engine numbers them) to the
chosen online workers, each taking as many as it has free slots, in registration order.
"""

import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.errors import ConflictError, InputError
from pipestudio.backend.repositories import Events, Metrics, Runs, Workers
from pipestudio.backend.schemas.runs import RunCreate, RunPublic
from pipestudio.backend.services import messages
from pipestudio.backend.services.plans import plan_for_launch
from pipestudio.planner import Plan

Send = Callable[[str, dict[str, Any]], bool]


def run_public(session: Session, run: models.Run) -> RunPublic:
    ranks = Runs(session).ranks(run.id)
    return RunPublic.model_validate({**{c: getattr(run, c) for c in RunPublic.model_fields
                                        if c != "ranks"},
                                     "ranks": [r.__dict__ for r in ranks]})


def _assign(session: Session, plan: Plan, data: RunCreate, connected: set[str]
            ) -> list[tuple[int, str, int, int]]:
    """(rank, worker_id, stage, replica) for every rank of the plan."""
    online = [w for w in Workers(session).online() if w.id in connected]
    if data.worker_ids is not None:
        unknown = sorted(set(data.worker_ids) - {w.id for w in online})
        if unknown:
            raise InputError("worker_ids", f"worker(s) {', '.join(unknown)} are not online")
        online = [w for w in online if w.id in data.worker_ids]
    busy = Runs(session).busy_ranks_by_worker()
    free = [(w.id, w.slots - busy.get(w.id, 0)) for w in online]
    slots = [worker_id for worker_id, count in free for _ in range(max(count, 0))]
    workers = [(stage_idx, replica) for stage_idx, stage in enumerate(plan.stages)
               for replica in range(stage.replicas)]
    if len(slots) < len(workers):
        raise ConflictError(f"the plan needs {len(workers)} ranks but the "
                            f"{len(online)} online worker(s) have {len(slots)} free slot(s)")
    return [(rank, slots[rank], stage_idx, replica)
            for rank, (stage_idx, replica) in enumerate(workers)]


def launch(session: Session, data: RunCreate, connected: set[str], send: Send) -> models.Run:
    """Store the run and its ranks, commit, then send each worker its assignment."""
    plan_row, plan = plan_for_launch(session, data.plan_id)
    assignment = _assign(session, plan, data, connected)
    settings = data.model_dump(include={"lr", "seed", "device", "threads_per_rank",
                                        "timeout_s"})
    run = Runs(session).add(models.Run(
        plan_id=plan_row.id, state="starting", model=data.model, model_args=data.model_args,
        steps=data.steps, settings=settings, created_by=data.author))
    session.add_all(models.RunRank(run_id=run.id, rank=rank, worker_id=worker_id,
                                   stage=stage, replica=replica, state="assigned")
                    for rank, worker_id, stage, replica in assignment)
    plan_row.state = "launched"
    session.add(models.Event(run_id=run.id, kind="launch", data={
        "plan_id": plan_row.id, "ranks": [list(a) for a in assignment]},
        message=f"launched plan {plan_row.id} on {len(assignment)} ranks"))
    session.commit()
    config = {"plan": plan.model_dump(mode="json"), "model": data.model,
              "model_args": data.model_args, "steps": data.steps, **settings}
    for worker_id in dict.fromkeys(a[1] for a in assignment):
        ranks = [{"rank": r, "stage": s, "replica": p}
                 for r, w, s, p in assignment if w == worker_id]
        message = {"type": "assign", "run_id": run.id, "world_size": len(assignment),
                   "ranks": ranks, "config": config, "open_store": ranks[0]["rank"] == 0}
        if not send(worker_id, message):
            fail(session, run, f"worker {worker_id} could not be reached", send)
            break
    return run


def fail(session: Session, run: models.Run, reason: str, send: Send) -> None:
    actions = messages.end_run(session, run, "failed", reason)
    session.commit()
    for worker_id, message in actions.to_workers:
        send(worker_id, message)


def stop(session: Session, run_id: int, send: Send) -> tuple[models.Run, messages.Actions]:
    run = Runs(session).get(run_id)
    if run.state in messages.TERMINAL_RUN_STATES:
        raise ConflictError(f"run {run_id} is already {run.state}")
    actions = messages.end_run(session, run, "stopped", "stopped on request")
    session.commit()
    for worker_id, message in actions.to_workers:
        send(worker_id, message)
    return run, actions


def command(run: models.Run, name: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"type": "command", "command_id": uuid.uuid4().hex, "run_id": run.id,
            "command": name, "payload": payload}


def metrics(session: Session, run_id: int, kinds: list[str], stage: int | None,
            start_ms: float | None, end_ms: float | None, max_points: int
            ) -> tuple[list[models.Metric], int, int]:
    Runs(session).get(run_id)
    if start_ms is not None and end_ms is not None and end_ms < start_ms:
        raise InputError("query.end_ms", f"end_ms {end_ms} is before start_ms {start_ms}")
    return Metrics(session).query(run_id, kinds, stage, start_ms, end_ms, max_points)


def events(session: Session, run_id: int, kinds: list[str] | None, after_id: int,
           limit: int) -> list[models.Event]:
    Runs(session).get(run_id)
    return Events(session).query(run_id, kinds, after_id, limit)
