"""Runs: launching an approved plan on workers, their state, metrics and events."""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from pipestudio.backend.schemas.common import DbId, Public

RunState = Literal["starting", "running", "resuming", "finished", "failed", "stopped"]
MetricKind = Literal["step", "memory", "op"]


class RunCreate(BaseModel):
    plan_id: DbId
    model: str = Field(min_length=1, max_length=200,
                       description="A built-in model (mlp, gpt, ...) or MODULE:FACTORY.")
    model_args: dict[str, str] = Field(default_factory=dict)
    steps: int = Field(ge=1, le=10_000_000)
    lr: float | None = Field(None, gt=0)
    seed: int | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads_per_rank: int | None = Field(None, ge=1, le=1024)
    timeout_s: float = Field(20.0, gt=0, le=3600)
    checkpoint_every: int = Field(
        0, ge=0, le=10_000_000,
        description="Save a checkpoint every this many steps (0: none) in the backend's "
        "checkpoint directory.")
    on_failure: Literal["fail", "resume"] = Field(
        "fail", description="resume: when a rank fails or a worker falls silent, start the "
        "run again from its last checkpoint on the online workers (from step 0 if none).")
    max_resumes: int = Field(3, ge=0, le=100,
                             description="With on_failure=resume, how many times at most.")
    worker_ids: list[str] | None = Field(None, description="Default: any online workers.")
    author: str = Field("api", max_length=200)


class RankPublic(Public):
    rank: int
    worker_id: str
    stage: int
    replica: int


class RunPublic(Public):
    id: int
    plan_id: int
    state: RunState
    model: str
    model_args: dict[str, Any]
    steps: int
    settings: dict[str, Any]
    store_address: str | None
    message: str | None
    last_step: int | None
    attempt: int
    created_by: str
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    ranks: list[RankPublic]


class RunsPublic(BaseModel):
    data: list[RunPublic]
    count: int


class MetricPublic(Public):
    id: int
    kind: str
    worker_id: str | None
    stage: int | None
    replica: int | None
    step: int | None
    time_ms: float | None
    received_at: datetime
    data: dict[str, Any]


class MetricsPublic(BaseModel):
    """Metrics in time order; ``stride`` > 1 when they were thinned to ``max_points``."""

    data: list[MetricPublic]
    count: int
    total: int
    stride: int


class EventPublic(Public):
    id: int
    kind: str
    worker_id: str | None
    stage: int | None
    step: int | None
    message: str | None
    data: dict[str, Any]
    created_at: datetime


class EventsPublic(BaseModel):
    data: list[EventPublic]
    count: int
