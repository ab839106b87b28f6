"""Which workers may speak of a run: its ``store`` and ``run_state`` come from the workers
of its current attempt (the store from rank 0's), its events and command results from any
worker that held one of its ranks. Anyone else's message about it is rejected
(``ingest.py``): a worker token is not a licence to fail another worker's run.

Who holds a run's ranks changes only when an attempt starts (``runs.launch``,
``runs.relaunch``) or ends (``messages.begin_resume``), so it is read once per attempt and
phase and kept (``HolderCache``), not on every batch of metrics.
"""

import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from pipestudio.backend import models


@dataclass(frozen=True)
class RunHolders:
    #: (attempt, waiting to resume): when it changes, the ranks have changed.
    key: tuple[int, bool]
    current: frozenset[str]
    rank0: str | None
    ever: frozenset[str]

    def may_send(self, worker_id: str, kind: str, same_attempt: bool) -> bool:
        if kind in ("store", "run_state") and same_attempt:
            return worker_id == self.rank0 if kind == "store" else worker_id in self.current
        return worker_id in self.current or worker_id in self.ever


def _key(run: models.Run) -> tuple[int, bool]:
    return run.attempt, run.state == "resuming"


class HolderCache:
    """``RunHolders`` by run, read again only when a run's ``_key`` changes."""

    def __init__(self) -> None:
        self.runs: dict[int, RunHolders] = {}
        self._lock = threading.Lock()

    def for_runs(self, session: Session, runs: list[models.Run]) -> dict[int, RunHolders]:
        with self._lock:
            known = {
                run.id: self.runs[run.id]
                for run in runs
                if run.id in self.runs and self.runs[run.id].key == _key(run)
            }
        stale = [run for run in runs if run.id not in known]
        if stale:
            fresh = _read(session, stale)
            with self._lock:
                self.runs.update(fresh)
            known.update(fresh)
        return known

    def streamable(self, run_id: Any, worker_id: str) -> bool:
        """Whether ``worker_id``'s events about ``run_id`` are stored, as last read."""
        found = self.runs.get(run_id) if isinstance(run_id, int) else None
        return found is not None and (worker_id in found.current or worker_id in found.ever)


def _read(session: Session, runs: list[models.Run]) -> dict[int, RunHolders]:
    ids = [run.id for run in runs]
    current: dict[int, set[str]] = {run_id: set() for run_id in ids}
    rank0: dict[int, str] = {}
    ever: dict[int, set[str]] = {run_id: set() for run_id in ids}
    for rank in session.scalars(select(models.RunRank).where(models.RunRank.run_id.in_(ids))):
        current[rank.run_id].add(rank.worker_id)
        if rank.rank == 0:
            rank0[rank.run_id] = rank.worker_id
    for run_id, data in session.execute(
        select(models.Event.run_id, models.Event.data).where(
            models.Event.run_id.in_(ids), models.Event.kind.in_(("launch", "resume"))
        )
    ):
        ever[run_id].update(str(rank[1]) for rank in data.get("ranks", []))
    return {
        run.id: RunHolders(
            _key(run), frozenset(current[run.id]), rank0.get(run.id), frozenset(ever[run.id])
        )
        for run in runs
    }
