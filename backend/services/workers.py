"""Workers: registration on ``hello``, reconciling their runs, and noticing silence.

A worker that comes back is judged: a running run with ranks on it that its ``hello`` does
not list is failed (the worker restarted and lost them). The judgment waits until the
messages the worker numbered before its ``hello`` are stored (``Judgment.after_seq``): a
run that finished while the server was away has its ``finished`` among them.

A worker silent for ``worker_timeout_s`` (no heartbeat, or disconnected and not back) is
marked offline and every active run with a rank on it fails; after a backend restart the
timeout counts from the start, so workers that reconnect in time keep their runs.
"""

import hashlib
import hmac
import secrets
import time
import uuid
from dataclasses import dataclass

from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.hub import Hub
from pipestudio.backend.protocol import Hello
from pipestudio.backend.repositories import Runs, Workers
from pipestudio.backend.services import messages
from pipestudio.backend.services.messages import Actions


@dataclass
class Judgment:
    """What a ``hello`` says the worker holds, to judge once ``after_seq`` is stored."""

    worker_id: str
    held: set[tuple[int, int]]
    after_seq: int


class IdentityError(ValueError):
    """A ``hello`` claims a worker id without that worker's secret."""


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _known(session: Session, hello: Hello) -> models.Worker | None:
    """The worker this ``hello`` comes from: the id it says, with the secret its last
    ``welcome`` gave (which the agent keeps across restarts: ``runtime/agent/identity``);
    None for a worker the backend does not know."""
    if hello.worker_id is None:
        return None
    found = session.get(models.Worker, hello.worker_id)
    if (
        found is not None
        and found.secret_sha256 is not None
        and not (hello.secret and hmac.compare_digest(_digest(hello.secret), found.secret_sha256))
    ):
        raise IdentityError(
            f"worker id {found.id} is another worker's: say it with the secret its welcome gave"
        )
    return found


def register(session: Session, hello: Hello) -> tuple[models.Worker, Judgment, str]:
    """The worker a ``hello`` names (or a new one), online; the judgment of its runs, to
    be made now or once its earlier messages are stored (``Judgment``); and the secret to
    put in its ``welcome`` (the one it said, or a new one: only the hash is kept)."""
    worker = _known(session, hello)
    fields = {
        "name": hello.name,
        "host": hello.host,
        "devices": hello.devices,
        "slots": hello.slots if hello.slots is not None else len(hello.devices),
        "builtin_models": hello.models,
        "allowed_models": hello.allowed_models,
        "state": "online",
        "connected_at": models.utcnow(),
        "last_seen_at": models.utcnow(),
    }
    if worker is None:
        worker = Workers(session).add(
            models.Worker(id=uuid.uuid4().hex, last_seq=hello.next_seq - 1, **fields)
        )
    else:
        for key, value in fields.items():
            setattr(worker, key, value)
        if hello.last_seq is not None and hello.last_seq < worker.last_seq:
            worker.last_seq = hello.next_seq - 1  # a restarted process numbers from 1 again
    secret = (
        hello.secret if hello.worker_id == worker.id and hello.secret else secrets.token_urlsafe(32)
    )
    worker.secret_sha256 = _digest(secret)
    session.flush()
    held = {(run.run_id, run.attempt) for run in hello.runs}
    after = hello.last_seq if hello.last_seq is not None else worker.last_seq
    return worker, Judgment(worker.id, held, after_seq=after), secret


def judge(session: Session, judgment: Judgment) -> Actions:
    """Fail the running runs whose ranks on the worker it no longer holds (it restarted),
    and stop the attempts it holds that are over."""
    actions = Actions()
    worker = session.get(models.Worker, judgment.worker_id)
    if worker is None:
        return actions
    for run in Runs(session).active():
        mine = [
            r
            for r in Runs(session).ranks(run.id)
            if r.worker_id == worker.id and r.state not in messages.TERMINAL_RUN_STATES
        ]
        if mine and (run.id, run.attempt) not in judgment.held and run.state == "running":
            actions.extend(
                messages.end_run(
                    session,
                    run,
                    "failed",
                    (
                        f"worker {worker.name} ({worker.id}) came back without the ranks of run "
                        f"{run.id}: it restarted"
                    ),
                )
            )
    for run_id, attempt in sorted(judgment.held):
        held = session.get(models.Run, run_id)
        if held is None or held.state in messages.TERMINAL_RUN_STATES or attempt != held.attempt:
            actions.to_workers.append(
                (
                    worker.id,
                    {
                        "type": "command",
                        "command_id": uuid.uuid4().hex,
                        "run_id": run_id,
                        "command": "stop",
                        "payload": {"reason": "the run is no longer active", "attempt": attempt},
                    },
                )
            )
    session.flush()
    return actions


def check_silence(
    session: Session, online: list[models.Worker], hub: Hub, timeout_s: float
) -> Actions:
    """Mark silent workers of ``online`` (``touch``'s answer) offline, close their
    connections (a link that comes back would otherwise carry heartbeats of a worker
    recorded offline: closed, the worker says hello again and is online) and fail the
    active runs that used them."""
    now = time.monotonic()
    actions = Actions()
    silent = {}
    for worker in online:
        quiet_s = now - hub.silent_since(worker.id)
        if quiet_s > timeout_s:
            worker.state = "offline"
            silent[worker.id] = (worker, quiet_s)
            actions.to_disconnect.append(
                (worker.id, f"silent for {quiet_s:.0f} s: reconnect and say hello again")
            )
    if not silent:
        return actions
    for run in Runs(session).active():
        lost = [r for r in Runs(session).ranks(run.id) if r.worker_id in silent]
        if lost:
            worker, quiet_s = silent[lost[0].worker_id]
            actions.extend(
                messages.end_run(
                    session,
                    run,
                    "failed",
                    (
                        f"worker {worker.name} ({worker.id}) on {worker.host} with rank(s) "
                        f"{', '.join(str(r.rank) for r in lost)} has been silent for "
                        f"{quiet_s:.0f} s"
                    ),
                )
            )
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
                time.time() - (now - last), models.utcnow().tzinfo
            )
    return sorted((w for w in locked.values() if w.state == "online"), key=lambda w: w.created_at)
