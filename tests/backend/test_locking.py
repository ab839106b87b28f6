"""Transactions that change several workers at once do not deadlock, the ingest writer
retries a batch the database rolled back as a deadlock's victim, and a cluster cannot
change under a plan being made on it."""

import threading
import time
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from pipestudio.backend import models
from pipestudio.backend.db import Database
from pipestudio.backend.errors import ConflictError
from pipestudio.backend.ingest import Ingestor
from pipestudio.backend.migrate import upgrade
from pipestudio.backend.repositories import Workers
from pipestudio.backend.schemas.clusters import ClusterCreate
from pipestudio.backend.services import clusters as cluster_service
from pipestudio.backend.services import workers
from pipestudio.backend.services.plans import documents
from pipestudio.planner import cluster_template
from tests.backend.conftest import empty_postgres, small_profile
from tests.backend.test_sockets import _start, _step


def _worker(worker_id: str) -> models.Worker:
    return models.Worker(id=worker_id, name=worker_id, host="h", devices=[], slots=1)


def test_watchdog_and_ingest_lock_workers_in_one_order(postgres_database: str) -> None:
    """The interleaving that deadlocked: the ingest writer holds worker ``a`` and then
    updates ``b`` while the watchdog persists heartbeats heard from ``b`` before ``a``.
    The watchdog locks both in id order before changing either, so it waits on ``a``
    holding nothing, and the writer goes through."""
    empty_postgres(postgres_database)
    db = Database(postgres_database)
    upgrade(db.engine)
    with db.session() as session:
        session.add_all([_worker("a"), _worker("b")])
    failures: list[BaseException] = []
    touched = threading.Event()

    def watchdog() -> None:
        try:
            with db.session() as session:
                now = time.monotonic()
                workers.touch(session, {"b": now, "a": now})  # heard from b first
            touched.set()
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    try:
        with db.session() as ingest:
            ingest.execute(text("SET LOCAL deadlock_timeout = '100ms'"))
            held = Workers(ingest).locked(["a"])
            held["a"].last_seq = 1
            ingest.flush()
            thread = threading.Thread(target=watchdog)
            thread.start()
            time.sleep(0.5)  # the watchdog is now waiting for a
            assert not touched.is_set(), "the watchdog changed a worker the writer holds"
            ingest.get_one(models.Worker, "b").last_seq = 1
            ingest.flush()
        thread.join(10)
        assert not failures, failures
        assert touched.is_set()
        with db.session() as session:
            assert [w.last_seq for w in Workers(session).locked(["a", "b"]).values()] == [1, 1]
    finally:
        db.dispose()


def test_the_watchdog_locks_and_judges_online_workers_it_did_not_hear_from(
    postgres_database: str,
) -> None:
    """``touch`` locks every online worker, heard from or not (``check_silence`` may mark
    any of them offline), in the same query that reads them, and hands them on: a worker
    the writer holds that the watchdog did not hear from still makes it wait."""
    empty_postgres(postgres_database)
    db = Database(postgres_database)
    upgrade(db.engine)
    with db.session() as session:
        session.add_all([_worker("a"), _worker("b"), _worker("c")])
        session.flush()
        session.get_one(models.Worker, "b").state = "offline"
    answers: list[list[str]] = []
    failures: list[BaseException] = []

    def watchdog() -> None:
        try:
            with db.session() as session:
                online = workers.touch(session, {"b": time.monotonic()})
                answers.append([w.id for w in online])
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    try:
        with db.session() as ingest:
            Workers(ingest).locked(["c"])["c"].last_seq = 1
            ingest.flush()
            thread = threading.Thread(target=watchdog)
            thread.start()
            time.sleep(0.5)
            assert not answers, "the watchdog went on while the writer held online worker c"
        thread.join(10)
        assert not failures, failures
        assert answers == [["a", "c"]]  # online, in registration order; b is offline
    finally:
        db.dispose()


def test_ingest_retries_a_batch_chosen_as_a_deadlock_victim(
    client: TestClient, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Ingestor._store
    failed: list[int] = []

    def once_a_deadlock(self: Ingestor, batch: list[Any]) -> Any:
        if not failed:
            failed.append(len(batch))
            raise OperationalError(
                "UPDATE workers ...", {}, psycopg.errors.DeadlockDetected("deadlock detected")
            )
        return store(self, batch)

    monkeypatch.setattr(Ingestor, "_store", once_a_deadlock)
    a, b = fake("a"), fake("b")
    run_id = _start(client, [a, b])
    for step in range(2):
        b.expect_ack(b.send({"type": "events", "run_id": run_id, "events": [_step(1, step)]}))
    assert failed, "no batch went through the failing store"
    stored = client.get(f"/api/runs/{run_id}/metrics", params={"kind": "step"}).json()
    assert stored["total"] == 2


def test_a_cluster_changed_while_a_plan_is_made_on_it_waits_and_sees_the_plan(
    postgres_database: str,
) -> None:
    """A plan being made on a cluster holds the cluster's row (``documents``); a request
    replacing the cluster meanwhile waits, then sees the plan and is refused (409), so no
    stored plan is predicted on a cluster that has since changed."""
    empty_postgres(postgres_database)
    db = Database(postgres_database)
    upgrade(db.engine)
    document = cluster_template([2], [10.0]).model_dump(mode="json")
    with db.session() as session:
        profile = models.Profile(
            name="p",
            model="toy",
            num_layers=4,
            microbatch_size=2,
            source="test",
            document=small_profile(),
        )
        cluster = models.Cluster(name="c", num_devices=2, document=document)
        session.add_all([profile, cluster])
        session.flush()
        profile_id, cluster_id = profile.id, cluster.id
    outcome: list[BaseException | str] = []
    replaced = threading.Event()

    def replace() -> None:
        try:
            with db.session() as session:
                cluster_service.replace_cluster(
                    session,
                    cluster_id,
                    ClusterCreate.model_validate(
                        {"name": "wider", "cluster": cluster_template([4], [10.0])}
                    ),
                )
            outcome.append("replaced")
        except BaseException as exc:  # judged below
            outcome.append(exc)
        replaced.set()

    try:
        with db.session() as planning:
            documents(planning, profile_id, cluster_id)  # the plan is being made on it
            thread = threading.Thread(target=replace)
            thread.start()
            time.sleep(0.5)
            assert not replaced.is_set(), "the cluster changed under a plan being made on it"
            planning.add(
                models.Plan(
                    name="x",
                    profile_id=profile_id,
                    cluster_id=cluster_id,
                    document={},
                    planner="manual",
                    parameters={},
                    created_by="test",
                )
            )
        thread.join(10)
        assert len(outcome) == 1 and isinstance(outcome[0], ConflictError), outcome
        with db.session() as session:
            assert session.get_one(models.Cluster, cluster_id).num_devices == 2
    finally:
        db.dispose()
