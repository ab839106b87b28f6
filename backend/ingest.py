"""Storing workers' numbered messages: one writer, group commits, acks after the commit.

The websocket handlers only enqueue. One task takes whatever is queued (up to
``_MAX_BATCH`` messages), stores it in one transaction in a thread, then acks each message
to its worker and hands events (and metrics not streamed yet) to the dashboards; metrics
of a message that is next in order are streamed as it arrives (``Ingestor.submit``), so the
dashboards' latency does not include the commit. Group commit keeps the
per-message cost of a commit (an fsync on SQLite, a round trip on PostgreSQL) shared by
every worker, and one writer is all SQLite allows anyway. A message is applied only when
its ``seq`` is the worker's ``last_seq + 1`` (``protocol.py``).

One message cannot fail the others: a message ``screening.screen`` refuses, or one about
a run its worker has no rank in, is rejected (acked, recorded on its run as a ``rejected``
event, never applied); and when a batch fails in the database anyway, it is stored again
one message per transaction, so that only the message that fails is rejected. No worker
is disconnected for what it sent, only for a gap in its numbers.
"""

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from anyio import to_thread
from sqlalchemy import insert, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.db import Database
from pipestudio.backend.hub import Hub
from pipestudio.backend.repositories import Workers
from pipestudio.backend.services import messages, screening, workers
from pipestudio.backend.services.holders import HolderCache, RunHolders
from pipestudio.backend.services.messages import Actions
from pipestudio.backend.services.workers import Judgment

log = logging.getLogger("pipestudio.backend")
_MAX_BATCH = 2000
_STORE_ATTEMPTS = 3
#: PostgreSQL's deadlock_detected and serialization_failure: the transaction may be retried.
_RETRY_SQLSTATES = ("40P01", "40001")
_METRIC_COLUMNS = (
    "run_id",
    "worker_id",
    "kind",
    "stage",
    "replica",
    "step",
    "time_ms",
    "received_at",
    "data",
)
_COPY_METRICS = f"COPY metrics ({', '.join(_METRIC_COLUMNS)}) FROM STDIN"


@dataclass
class Item:
    worker_id: str
    message: dict[str, Any]
    verdict: str = "pending"  # stored | repeat | gap | rejected
    #: Its metrics already went to the dashboards (``Ingestor.submit``).
    early: bool = False
    #: Why ``screening.screen`` refused it (None: it may be applied).
    refusal: str | None = None


@dataclass
class Stored:
    """What storing a batch leaves to do after its commit."""

    actions: Actions = field(default_factory=Actions)
    #: Judgments made in the batch (``workers.Judgment``), to forget once committed.
    judged: list[Judgment] = field(default_factory=list)

    def extend(self, other: "Stored") -> None:
        self.actions.extend(other.actions)
        self.judged += other.judged


class Ingestor:
    def __init__(self, db: Database, hub: Hub) -> None:
        self.db, self.hub = db, hub
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        #: Per worker, the number its next message has to carry to be streamed at once.
        self.next_seq: dict[str, int] = {}
        #: Per reconnected worker, the judgment of its runs waiting for its old messages.
        self.judgments: dict[str, Judgment] = {}
        #: Who holds each run's ranks: only their metrics are streamed before the commit
        #: (a stranger's are rejected, unseen).
        self.holders = HolderCache()

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name="pipestudio-ingest")

    async def stop(self) -> None:
        if self.task is not None:
            while not self.queue.empty() and not self.task.done():
                await asyncio.sleep(0.01)
            self.task.cancel()

    def expect(self, worker_id: str, last_seq: int) -> None:
        """A worker (re)connected with ``last_seq`` stored: stream from the next number."""
        self.next_seq[worker_id] = last_seq + 1

    def judge_later(self, judgment: Judgment) -> None:
        """Judge the worker's runs once its message ``judgment.after_seq`` is stored."""
        self.judgments[judgment.worker_id] = judgment

    def submit(self, worker_id: str, message: dict[str, Any], *, suspect: bool = True) -> None:
        """Queue a message for the writer; stream its metrics now if it is the next one.

        Dashboards get metrics without waiting for the commit. The message that is next in
        order is streamed here and flagged ``early``; every other stored message is streamed
        after its commit, so nothing stored goes unstreamed. A streamed message whose store
        then fails is resent by its worker and streamed again (a duplicate, never a loss).
        A message ``screening.screen`` refuses is never streamed; ``suspect`` false: its
        raw frame holds no NaN, infinity or escape, so the walks for them are skipped.
        """
        problem = None
        if suspect:
            message, problem = screening.cleaned(message)
        item = Item(worker_id, message)
        try:
            screening.screen(message)
        except screening.Rejected as exc:
            item.refusal = str(exc)
        item.refusal = item.refusal or problem
        run_id, seq = message.get("run_id"), message.get("seq")
        if seq is not None and seq == self.next_seq.get(worker_id):
            self.next_seq[worker_id] = seq + 1
            item.early = (
                message.get("type") == "events"
                and item.refusal is None
                and self.holders.streamable(run_id, worker_id)
            )
        if item.early and run_id is not None:
            events = messages.metric_events(message)
            if events:
                self.hub.publish(run_id, messages.metrics_message(run_id, events, time.time()))
        self.queue.put_nowait(item)

    async def _run(self) -> None:
        while True:
            batch = [await self.queue.get()]
            while not self.queue.empty() and len(batch) < _MAX_BATCH:
                batch.append(self.queue.get_nowait())
            try:
                stored = await self._store_retrying(batch)
            except Exception as exc:
                log.warning(
                    "storing %d worker messages at once failed (%s); storing them one by one",
                    len(batch),
                    _reason(exc),
                )
                try:
                    stored = await to_thread.run_sync(self._store_each, batch)
                except Exception:
                    log.exception(
                        "storing %d worker messages failed; their workers reconnect and resend",
                        len(batch),
                    )
                    await self._close({item.worker_id for item in batch})
                    continue
            await self._after(batch, stored)

    async def _store_retrying(self, batch: list[Item]) -> Stored:
        """``_store``, again when the database chose its transaction as a deadlock's or a
        serialization conflict's victim (it rolled back whole, so a retry is safe)."""
        for attempt in range(1, _STORE_ATTEMPTS):
            try:
                return await to_thread.run_sync(self._store, batch)
            except OperationalError as exc:
                code = getattr(exc.orig, "sqlstate", None)
                if code not in _RETRY_SQLSTATES:
                    raise
                log.warning(
                    "storing %d worker messages: %s (SQLSTATE %s); attempt %d of %d",
                    len(batch),
                    type(exc.orig).__name__,
                    code,
                    attempt + 1,
                    _STORE_ATTEMPTS,
                )
        return await to_thread.run_sync(self._store, batch)

    def _store_each(self, batch: list[Item]) -> Stored:
        """The batch one message per transaction: a message the database refuses is
        rejected alone (module docstring)."""
        stored = Stored()
        for item in batch:
            try:
                stored.extend(self._store([item], stored.judged))
            except OperationalError:
                raise  # the database is away or busy, not refusing this message: resend
            except Exception as exc:
                stored.extend(self._reject_alone(item, _reason(exc), stored.judged))
        return stored

    def _store(self, batch: list[Item], judged: list[Judgment] | None = None) -> Stored:
        """Store ``batch`` in one transaction (``judged``: the judgments made already by
        earlier transactions of the same batch)."""
        earlier, stored = judged or [], Stored()
        with self.db.session() as session, session.no_autoflush:
            found, runs = _prefetch(session, batch)
            holders = self.holders.for_runs(session, runs)
            for item in batch:
                worker = found.get(item.worker_id)
                seq = item.message.get("seq")
                if worker is None or not isinstance(seq, int) or seq > worker.last_seq + 1:
                    item.verdict = "gap"
                    continue
                if seq <= worker.last_seq:
                    item.verdict = "repeat"
                else:
                    worker.last_seq = seq
                    refusal = item.refusal or _intruder(session, item, holders)
                    if refusal is None:
                        item.verdict = "stored"
                        stored.actions.extend(self._apply(session, item))
                    else:
                        item.verdict = "rejected"
                        stored.actions.extend(_record_rejection(session, item, refusal))
                stored.extend(self._judge_if_due(session, item, [*earlier, *stored.judged]))
            _insert_metrics(session, stored.actions.metric_rows)
        return stored

    @staticmethod
    def _apply(session: Session, item: Item) -> Actions:
        done = apply_message(session, item.worker_id, item.message)
        if item.early:
            done.to_watchers = [
                (run_id, message)
                for run_id, message in done.to_watchers
                if message["type"] != "metrics"
            ]
        return done

    def _judge_if_due(self, session: Session, item: Item, judged: list[Judgment]) -> Stored:
        """Judge the worker's runs when this message is the last it numbered before its
        ``hello`` (``workers.Judgment``)."""
        judgment = self.judgments.get(item.worker_id)
        if judgment is None or judgment in judged or item.message["seq"] < judgment.after_seq:
            return Stored()
        return Stored(workers.judge(session, judgment), [judgment])

    def _reject_alone(self, item: Item, reason: str, judged: list[Judgment]) -> Stored:
        """Take the message the database refused out of the worker's sequence, and record
        why on its run."""
        stored = Stored()
        with self.db.session() as session:
            worker = Workers(session).locked([item.worker_id]).get(item.worker_id)
            seq = item.message["seq"]
            if worker is None or seq > worker.last_seq + 1:
                item.verdict = "gap"
                return stored
            item.verdict = "repeat" if seq <= worker.last_seq else "rejected"
            worker.last_seq = max(worker.last_seq, seq)
        if item.verdict == "rejected":
            try:
                with self.db.session() as session:
                    stored.actions.extend(_record_rejection(session, item, reason))
            except Exception as exc:
                log.warning(
                    "recording the rejection of message %d of worker %s failed: %s",
                    seq,
                    item.worker_id,
                    _reason(exc),
                )
        with self.db.session() as session:
            stored.extend(self._judge_if_due(session, item, judged))
        return stored

    async def _after(self, batch: list[Item], stored: Stored) -> None:
        """Publish, then ack: one cumulative ack per worker (its highest number)."""
        gaps = {item.worker_id for item in batch if item.verdict == "gap"}
        for judgment in stored.judged:
            if self.judgments.get(judgment.worker_id) is judgment:
                del self.judgments[judgment.worker_id]
        for run_id, message in _merged(stored.actions.to_watchers):
            self.hub.publish(run_id, message)
        highest: dict[str, int] = {}
        for item in batch:
            if item.verdict in ("stored", "repeat", "rejected") and item.worker_id not in gaps:
                highest[item.worker_id] = max(highest.get(item.worker_id, 0), item.message["seq"])
        for worker_id, seq in highest.items():
            await self.hub.send(worker_id, {"type": "ack", "seq": seq})
        for worker_id, message in stored.actions.to_workers:
            await self.hub.send(worker_id, message)
        if gaps:
            log.warning("messages out of order from %s; closing to resync", sorted(gaps))
            await self._close(gaps)

    async def _close(self, worker_ids: set[str]) -> None:
        for worker_id in worker_ids:
            self.next_seq.pop(worker_id, None)
            link = self.hub.links.get(worker_id)
            if link is not None:
                try:
                    await link.socket.close(code=4409)
                except Exception as exc:
                    log.info("closing worker %s: %s", worker_id, exc)


def _prefetch(
    session: Session, batch: list[Item]
) -> tuple[dict[str, models.Worker], list[models.Run]]:
    """The batch's workers (locked first, in id order: ``Workers.locked``) and runs, in one
    ``SELECT`` each. While the caller holds the runs, ``apply_message``'s ``session.get``
    finds them in the identity map (which holds unchanged objects only weakly) without a
    round trip."""
    found = Workers(session).locked(item.worker_id for item in batch)
    run_ids = {run_id for item in batch if isinstance(run_id := item.message.get("run_id"), int)}
    runs = list(session.scalars(select(models.Run).where(models.Run.id.in_(run_ids))))
    return found, runs


def _intruder(session: Session, item: Item, holders: dict[int, RunHolders]) -> str | None:
    """Why the worker may not say this about its run, or None (``holders.py``)."""
    run_id, kind = item.message["run_id"], item.message["type"]
    run = session.get(models.Run, run_id)
    if run is None:
        return f"run {run_id} does not exist"
    same_attempt = item.message.get("attempt", 0) == run.attempt
    if not holders[run_id].may_send(item.worker_id, kind, same_attempt):
        return f"worker {item.worker_id} holds no rank of run {run_id} that may send a {kind}"
    return None


def _record_rejection(session: Session, item: Item, reason: str) -> Actions:
    """A ``rejected`` event on the message's run (when it names one), for the dashboard."""
    seq, kind, run_id = (
        item.message.get("seq"),
        str(item.message.get("type"))[:40],
        item.message.get("run_id"),
    )
    text = f"message {seq} ({kind}) of worker {item.worker_id} was rejected: {reason}"
    log.warning("%s", text)
    if type(run_id) is not int or session.get(models.Run, run_id) is None:
        return Actions()
    event = models.Event(
        run_id=run_id,
        worker_id=item.worker_id,
        kind="rejected",
        message=text,
        data={"type": "rejected", "seq": seq, "kind": kind, "reason": reason},
    )
    session.add(event)
    return Actions(to_watchers=[(run_id, {"type": "event", "run_id": run_id, "event": event.data})])


def _reason(exc: BaseException) -> str:
    """An exception in one line (a database error's first line)."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


def _insert_metrics(session: Session, rows: list[dict[str, Any]]) -> None:
    """The batch's metric rows: ``COPY`` on PostgreSQL, executemany on SQLite.

    psycopg 3 runs an executemany as one pipelined statement per row, which the server
    plans and runs one by one (about 0.3 ms a row under load); ``COPY ... FROM STDIN``
    streams all rows in one statement of the same transaction. SQLite is in process, so its
    executemany is already one prepared statement stepped per row.
    """
    if not rows:
        return
    if session.get_bind().dialect.name != "postgresql":
        session.execute(insert(models.Metric), rows)
        return
    # psycopg's connection (DB-API's protocol does not know its cursors' ``copy``)
    raw: Any = session.connection().connection.dbapi_connection
    assert raw is not None
    with raw.cursor() as cursor, cursor.copy(_COPY_METRICS) as copy:
        for row in rows:
            copy.write_row([row[name] for name in _METRIC_COLUMNS[:-1]] + [json.dumps(row["data"])])


def _merged(messages: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, dict[str, Any]]]:
    """One ``metrics`` message per run per batch (others as they are, in order)."""
    merged: list[tuple[int, dict[str, Any]]] = []
    metrics: dict[int, dict[str, Any]] = {}
    for run_id, message in messages:
        if message["type"] != "metrics":
            merged.append((run_id, message))
        elif run_id in metrics:
            metrics[run_id]["events"].extend(message["events"])
        else:
            metrics[run_id] = {**message, "events": list(message["events"])}
            merged.append((run_id, metrics[run_id]))
    return merged


def apply_message(session: Session, worker_id: str, message: dict[str, Any]) -> Actions:
    """One numbered message (``protocol.py``) that ``screening.screen`` and ``_intruder``
    passed: its run exists and the worker may speak of it."""
    run = session.get(models.Run, message["run_id"])
    assert run is not None, "_intruder refuses a message about an unknown run"
    kind = message.get("type")
    if kind in ("store", "run_state") and message.get("attempt", 0) != run.attempt:
        log.info(
            "worker %s sent %s of attempt %r of run %d, which is at attempt %d: dropped",
            worker_id,
            kind,
            message.get("attempt"),
            run.id,
            run.attempt,
        )
        return Actions()
    if kind == "events":
        events = [e for e in message.get("events", []) if isinstance(e, dict)]
        return messages.apply_events(session, worker_id, run, events)
    if kind == "store":
        return messages.apply_store(
            session, run, str(message.get("host")), int(message.get("port", 0))
        )
    if kind == "run_state":
        return messages.apply_run_state(
            session,
            worker_id,
            run,
            str(message.get("state")),
            message.get("message"),
            retry=message.get("retry") is not False,
        )
    assert kind == "command_result", "screening.screen admits four types"
    return messages.apply_command_result(session, worker_id, run, message)
