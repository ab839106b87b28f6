"""Workers: registration on ``hello``, reconciling their runs, and noticing silence.

A worker silent for ``worker_timeout_s`` (no heartbeat, or disconnected and not back) is
marked offline and every active run with a rank on it fails; after a backend restart the
timeout counts from the start, so workers that reconnect in time keep their runs.
"""

import time
import uuid
from typing import Any

from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.hub import Hub
from pipestudio.backend.repositories import Runs, Workers
from pipestudio.backend.services import messages
from pipestudio.backend.services.messages import Actions


def register(session: Session, hello: dict[str, Any]) -> tuple[models.Worker, Actions]:
    """The worker a ``hello`` names (or a new one), online; and what its runs need."""
    worker_id = hello.get("worker_id")
    worker = session.get(models.Worker, worker_id) if isinstance(worker_id, str) else None
    next_seq = hello.get("next_seq", 1)
    next_seq = next_seq if isinstance(next_seq, int) and next_seq >= 1 else 1
    devices = [d for d in hello.get("devices", []) if isinstance(d, dict)]
    slots = hello.get("slots")
    fields = {"name": str(hello.get("name") or "worker")[:200],
              "host": str(hello.get("host") or "")[:200], "devices": devices,
              "slots": slots if isinstance(slots, int) and slots >= 0 else len(devices),
              "state": "online", "connected_at": models.utcnow(),
              "last_seen_at": models.utcnow()}
    actions = Actions()
    if worker is None:
        worker = Workers(session).add(models.Worker(id=uuid.uuid4().hex,
                                                    last_seq=next_seq - 1, **fields))
        return worker, actions
    for key, value in fields.items():
        setattr(worker, key, value)
    held = {(r["run_id"], r.get("attempt", 0)) for r in hello.get("runs", [])
            if isinstance(r, dict) and isinstance(r.get("run_id"), int)
            and isinstance(r.get("attempt", 0), int)}
    for run in Runs(session).active():
        ranks = Runs(session).ranks(run.id)
        if any(r.worker_id == worker.id for r in ranks) and (run.id, run.attempt) not in held \
                and run.state == "running":
            actions.extend(messages.end_run(session, run, "failed", (
                f"worker {worker.name} ({worker.id}) came back without the ranks of run "
                f"{run.id}: it restarted")))
    for run_id, attempt in held:
        run = session.get(models.Run, run_id)
        if run is None or run.state in messages.TERMINAL_RUN_STATES or attempt != run.attempt:
            actions.to_workers.append((worker.id, {
                "type": "command", "command_id": uuid.uuid4().hex, "run_id": run_id,
                "command": "stop", "payload": {"reason": "the run is no longer active",
                                               "attempt": attempt}}))
    session.flush()
    return worker, actions


def check_silence(session: Session, online: list[models.Worker], hub: Hub, timeout_s: float
                  ) -> Actions:
    """Mark silent workers of ``online`` (``touch``'s answer) offline and fail the active
    runs that used them."""
    now = time.monotonic()
    actions = Actions()
    silent = {}
    for worker in online:
        quiet_s = now - hub.silent_since(worker.id)
        if quiet_s > timeout_s:
            worker.state = "offline"
            silent[worker.id] = (worker, quiet_s)
    if not silent:
        return actions
    for run in Runs(session).active():
        lost = [r for r in Runs(session).ranks(run.id) if r.worker_id in silent]
        if lost:
            worker, quiet_s = silent[lost[0].worker_id]
            actions.extend(messages.end_run(session, run, "failed", (
                f"worker {worker.name} ({worker.id}) with rank(s) "
                f"{', '.join(str(r.rank) for r in lost)} has been silent for "
                f"{quiet_s:.0f} s")))
    return actions


def touch(session: Session, seen: dict[str, float]) -> list[models.Worker]:
    """Persist when workers were last heard from (the hub keeps it in memory); the online
    workers, in registration order, for ``check_silence``.

    First it locks every worker the watchdog's transaction may change (those heard from
    and those online, which ``check_silence`` may mark offline) in id order, as the ingest
    writer does (``Workers.locked``): without it the two deadlocked on PostgreSQL under load.
    One query reads and locks them all, so a worker that comes online meanwhile is neither
    missed by the lock nor judged unlocked.
    """
    now = time.monotonic()
    locked = Workers(session).locked(seen, online=True)
    for worker_id, last in seen.items():
        worker = locked.get(worker_id)
        if worker is not None:
            worker.last_seen_at = models.utcnow().fromtimestamp(
                time.time() - (now - last), models.utcnow().tzinfo)
    return sorted((w for w in locked.values() if w.state == "online"),
                  key=lambda w: w.created_at)
