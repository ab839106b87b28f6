"""Repositories: every query the services make, one class per table family."""

import math
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.errors import ConflictError, NotFoundError
from pipestudio.backend.protocol import METRIC_KINDS

M = TypeVar("M", bound=models.Base)


class Repository(Generic[M]):
    """get / page / add / delete of one table."""

    model: type[M]
    kind: str

    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, item_id: object, *, for_update: bool = False, for_share: bool = False) -> M:
        """The item; ``for_update`` locks its row until the transaction ends (PostgreSQL;
        SQLite's writers take turns anyway), so that two requests changing it take turns
        and the second sees what the first left, a deleted row included (404).
        ``for_share`` holds it against such a change while the transaction builds on it."""
        lock = True if for_update else {"read": True} if for_share else False
        item = self.session.get(
            self.model, item_id, with_for_update=lock, populate_existing=bool(lock)
        )
        if item is None:
            raise NotFoundError(self.kind, item_id)
        return item

    def page(self, offset: int, limit: int, *where: ColumnElement[bool]) -> tuple[list[M], int]:
        total = self.session.scalar(select(func.count()).select_from(self.model).where(*where))
        rows = self.session.scalars(
            select(self.model).where(*where).order_by(self._order()).offset(offset).limit(limit)
        )
        return list(rows), int(total or 0)

    def _order(self) -> Any:
        return self.model.id.desc()  # type: ignore[attr-defined]

    def add(self, item: M) -> M:
        self.session.add(item)
        self.session.flush()
        return item

    def delete(self, item: M) -> None:
        self.session.delete(item)
        self.session.flush()


class Profiles(Repository[models.Profile]):
    model, kind = models.Profile, "profile"


class Clusters(Repository[models.Cluster]):
    model, kind = models.Cluster, "cluster"


class Plans(Repository[models.Plan]):
    model, kind = models.Plan, "plan"

    def refuse_if_used(
        self, column: Any, item_id: int, what: str, remedy: str = "delete them first"
    ) -> None:
        """Raise a conflict naming the plans whose ``column`` is ``item_id`` (``what``, e.g.
        "cluster 3", is about to be deleted or changed; ``remedy`` says what to do)."""
        users = list(
            self.session.scalars(
                select(models.Plan.id).where(column == item_id).order_by(models.Plan.id)
            )
        )
        if users:
            raise ConflictError(
                f"{what} is used by plan(s) {', '.join(map(str, users))}; " + remedy
            )


def retained(retention_s: float) -> ColumnElement[bool]:
    """Workers online, or offline for less than ``retention_s``."""
    cutoff = models.utcnow() - timedelta(seconds=retention_s)
    return or_(models.Worker.state == "online", models.Worker.last_seen_at >= cutoff)


class Workers(Repository[models.Worker]):
    model, kind = models.Worker, "worker"

    def _order(self) -> Any:
        return models.Worker.created_at

    def online(self) -> list[models.Worker]:
        return list(
            self.session.scalars(
                select(models.Worker)
                .where(models.Worker.state == "online")
                .order_by(models.Worker.created_at)
            )
        )

    def locked(self, ids: Iterable[str], *, online: bool = False) -> dict[str, models.Worker]:
        """The workers with these ids (and with ``online``, every online worker too),
        row-locked until the transaction ends (PostgreSQL; SQLite locks the whole database
        anyway). Every transaction that changes several workers locks them here first, in
        id order, so that no two of them deadlock."""
        chosen: ColumnElement[bool] = models.Worker.id.in_(set(ids))
        if online:
            chosen = or_(chosen, models.Worker.state == "online")
        return {
            worker.id: worker
            for worker in self.session.scalars(
                select(models.Worker).where(chosen).order_by(models.Worker.id).with_for_update()
            )
        }


class Runs(Repository[models.Run]):
    model, kind = models.Run, "run"

    def active(self) -> list[models.Run]:
        return self.in_states(models.ACTIVE_RUN_STATES)

    def in_states(self, states: tuple[str, ...]) -> list[models.Run]:
        return list(
            self.session.scalars(
                select(models.Run).where(models.Run.state.in_(states)).order_by(models.Run.id)
            )
        )

    def ranks(self, run_id: int) -> list[models.RunRank]:
        return list(
            self.session.scalars(
                select(models.RunRank)
                .where(models.RunRank.run_id == run_id)
                .order_by(models.RunRank.rank)
            )
        )

    def busy_ranks_by_worker(self) -> dict[str, int]:
        rows = self.session.execute(
            select(models.RunRank.worker_id, func.count())
            .join(models.Run)
            .where(models.Run.state.in_(models.ACTIVE_RUN_STATES))
            .group_by(models.RunRank.worker_id)
        )
        return {worker_id: int(count) for worker_id, count in rows}

    def runs_of_plan(self, plan_id: int) -> int:
        return int(
            self.session.scalar(
                select(func.count()).select_from(models.Run).where(models.Run.plan_id == plan_id)
            )
            or 0
        )


class Proposals(Repository[models.Proposal]):
    model, kind = models.Proposal, "proposal"


class Metrics:
    """The high-rate table: filtered by kind, stage and time, thinned to a point budget."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def query(
        self,
        run_id: int,
        kinds: Sequence[str],
        stage: int | None,
        start_ms: float | None,
        end_ms: float | None,
        max_points: int,
    ) -> tuple[list[models.Metric], int, int]:
        where: list[ColumnElement[bool]] = [models.Metric.run_id == run_id]
        if not set(METRIC_KINDS) <= set(kinds):  # all kinds: the (run, time) index, in order
            where.append(models.Metric.kind.in_(kinds))
        if stage is not None:
            where.append(models.Metric.stage == stage)
        if start_ms is not None:
            where.append(models.Metric.time_ms >= start_ms)
        if end_ms is not None:
            where.append(models.Metric.time_ms <= end_ms)
        total = int(
            self.session.scalar(select(func.count()).select_from(models.Metric).where(*where)) or 0
        )
        stride = max(1, math.ceil(total / max_points))
        order = (models.Metric.time_ms, models.Metric.id)
        if stride == 1:
            rows = list(self.session.scalars(select(models.Metric).where(*where).order_by(*order)))
            return rows, total, 1
        numbered = (
            select(models.Metric.id, func.row_number().over(order_by=order).label("position"))
            .where(*where)
            .subquery()
        )
        chosen = select(numbered.c.id).where((numbered.c.position - 1) % stride == 0)
        rows = list(
            self.session.scalars(
                select(models.Metric).where(models.Metric.id.in_(chosen)).order_by(*order)
            )
        )
        return rows, total, stride


class Events:
    def __init__(self, session: Session) -> None:
        self.session = session

    def query(
        self, run_id: int, kinds: Sequence[str] | None, after_id: int, limit: int
    ) -> list[models.Event]:
        where: list[ColumnElement[bool]] = [
            models.Event.run_id == run_id,
            models.Event.id > after_id,
        ]
        if kinds:
            where.append(models.Event.kind.in_(kinds))
        return list(
            self.session.scalars(
                select(models.Event).where(*where).order_by(models.Event.id).limit(limit)
            )
        )

    def add(self, event: models.Event) -> models.Event:
        self.session.add(event)
        self.session.flush()
        return event
