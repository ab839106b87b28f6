"""The SQL tables (SQLAlchemy 2 ORM); the schema changes only through Alembic migrations.

Documents (profiles, clusters, plans, proposals) are stored whole as JSON beside the
columns the API filters and sorts on. ``metrics`` holds the engine's high-rate events
(``op``, ``step``, ``memory``) and ``events`` the rest (``start``, ``checkpoint``,
``summary``, ``error``, migrations, state changes).
"""

from datetime import datetime, timezone
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: Constraint names stay the same on every database, so migrations can name them.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
#: A 64-bit key that SQLite still numbers by itself (it autoincrements INTEGER only).
BigId = BigInteger().with_variant(Integer(), "sqlite")

PLAN_STATES = ("draft", "approved", "launched")
RUN_STATES = ("starting", "running", "finished", "failed", "stopped")
ACTIVE_RUN_STATES = ("starting", "running", "resuming")
PROPOSAL_STATES = ("pending", "approved", "rejected", "applied", "failed", "closed")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UtcDateTime(TypeDecorator[datetime]):
    """A UTC time that reads back time-zone aware on every database (SQLite drops it)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        list[Any]: JSON,
        datetime: UtcDateTime(),
    }


class Profile(Base):
    __tablename__ = "profiles"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(200), index=True)
    num_layers: Mapped[int]
    microbatch_size: Mapped[int]
    #: The arithmetic the profile was measured in (``Profile.precision``).
    precision: Mapped[str] = mapped_column(String(8), default="fp32", server_default="fp32")
    source: Mapped[str] = mapped_column(String(20))
    document: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Cluster(Base):
    __tablename__ = "clusters"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    num_devices: Mapped[int]
    document: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Plan(Base):
    __tablename__ = "plans"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    profile_id: Mapped[int] = mapped_column(ForeignKey("profiles.id"), index=True)
    cluster_id: Mapped[int | None] = mapped_column(ForeignKey("clusters.id"), index=True)
    state: Mapped[str] = mapped_column(String(20), default="draft")
    #: The arithmetic the plan trains in (``Plan.precision``, its profile's).
    precision: Mapped[str] = mapped_column(String(8), default="fp32", server_default="fp32")
    document: Mapped[dict[str, Any]]
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    planner: Mapped[str] = mapped_column(String(200))
    parameters: Mapped[dict[str, Any]]
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    approved_at: Mapped[datetime | None]


class Worker(Base):
    __tablename__ = "workers"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    host: Mapped[str] = mapped_column(String(200))
    devices: Mapped[list[Any]]
    slots: Mapped[int]
    #: The built-in models the worker has, and the patterns of other model factories it
    #: allows (``pipestudio worker --allow-model``): what the backend may send it.
    builtin_models: Mapped[list[Any]] = mapped_column(default=list, server_default="[]")
    allowed_models: Mapped[list[Any]] = mapped_column(default=list, server_default="[]")
    state: Mapped[str] = mapped_column(String(20), default="online")
    #: The highest message sequence number stored; a resent message at or below is a repeat.
    last_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    #: SHA-256 of the secret the worker was given in its last ``welcome``: only who holds
    #: it may come back under this id (``services/workers.py``).
    secret_sha256: Mapped[str | None] = mapped_column(String(64))
    connected_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("plans.id"), index=True)
    state: Mapped[str] = mapped_column(String(20), default="starting", index=True)
    model: Mapped[str] = mapped_column(String(200))
    model_args: Mapped[dict[str, Any]]
    #: The arithmetic the run trains in: its plan's.
    precision: Mapped[str] = mapped_column(String(8), default="fp32", server_default="fp32")
    steps: Mapped[int]
    settings: Mapped[dict[str, Any]]
    store_address: Mapped[str | None] = mapped_column(String(300))
    message: Mapped[str | None] = mapped_column(Text)
    last_step: Mapped[int | None]
    #: How many times the run was started again from its checkpoint after a failure.
    attempt: Mapped[int] = mapped_column(default=0, server_default="0")
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]


class RunRank(Base):
    """Which worker runs which rank (stage replica) of a run."""

    __tablename__ = "run_ranks"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    rank: Mapped[int] = mapped_column(primary_key=True)
    worker_id: Mapped[str] = mapped_column(ForeignKey("workers.id"), index=True)
    stage: Mapped[int]
    replica: Mapped[int]
    #: What the worker last said of this rank: assigned, running, finished, failed, stopped.
    state: Mapped[str] = mapped_column(String(20), default="assigned")


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (
        Index("ix_metrics_run_kind_time", "run_id", "kind", "time_ms"),
        Index("ix_metrics_run_time", "run_id", "time_ms", "id"),
    )
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    worker_id: Mapped[str | None] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(20))
    stage: Mapped[int | None]
    replica: Mapped[int | None]
    step: Mapped[int | None]
    time_ms: Mapped[float | None] = mapped_column(Float)
    received_at: Mapped[datetime] = mapped_column(default=utcnow)
    data: Mapped[dict[str, Any]]


class Event(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    worker_id: Mapped[str | None] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(30))
    stage: Mapped[int | None]
    step: Mapped[int | None]
    message: Mapped[str | None] = mapped_column(Text)
    data: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Proposal(Base):
    __tablename__ = "proposals"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    state: Mapped[str] = mapped_column(String(20), default="pending")
    document: Mapped[dict[str, Any]]
    worthwhile: Mapped[bool] = mapped_column(Boolean)
    gain_ms: Mapped[float] = mapped_column(Float)
    outcome: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(String(200))
    decided_by: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    decided_at: Mapped[datetime | None]


class UserSession(Base):
    """A sign-in: the SHA-256 of its bearer token (the token itself is never stored), who
    signed in, with which role, until when; and the SHA-256 of the credential it was made
    with (the API token, or the person's password hash), so that rotating the token or
    changing or removing the person ends it (``auth.Credentials.resolve``)."""

    __tablename__ = "sessions"
    token_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(20))
    issuer_sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(index=True)
