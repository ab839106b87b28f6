"""Runs: launching an approved plan on workers, their state, metrics and events."""

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from pipestudio.backend.schemas.common import DbId, Public, Request
from pipestudio.planner.formats.documents import Integral, Precision

RunState = Literal["starting", "running", "resuming", "finished", "failed", "stopped"]
MetricKind = Literal["step", "memory", "op"]


ArgName = Annotated[str, Field(min_length=1, max_length=100)]
ArgValue = Annotated[str, Field(max_length=1000)]
WorkerId = Annotated[str, Field(min_length=1, max_length=64)]


class RunCreate(Request):
    plan_id: DbId
    model: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description=(
            "A built-in model (mlp, gpt, ...) or MODULE:FACTORY; the chosen workers must allow "
            "it (409 naming those that do not). Default: the model of the plan's profile."
        ),
    )
    model_args: dict[ArgName, ArgValue] | None = Field(
        None,
        max_length=100,
        description=(
            "The model's arguments. Default: those the plan's profile was measured with (its "
            "config.* metadata), when the model is the profile's. Arguments that the profile "
            "recorded with another value are named in the launch event: the plan's predictions "
            "are for the profiled model."
        ),
    )
    steps: Annotated[int, Field(ge=1, le=10_000_000), Integral]
    lr: float | None = Field(None, gt=0, le=1e30, allow_inf_nan=False)
    seed: Annotated[int, Field(ge=0, le=2**53), Integral] | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads_per_rank: Annotated[int, Field(ge=1, le=1024), Integral] | None = None
    timeout_s: float = Field(20.0, gt=0, le=3600)
    checkpoint_every: Annotated[int, Field(ge=0, le=10_000_000), Integral] = Field(
        0,
        description="Save a checkpoint every this many steps (0: none) in the backend's "
        "checkpoint directory.",
    )
    on_failure: Literal["fail", "resume"] = Field(
        "fail",
        description="resume: when a rank fails or a worker falls silent, start the "
        "run again from its last checkpoint on the online workers (from step 0 if none).",
    )
    max_resumes: Annotated[int, Field(ge=0, le=100), Integral] = Field(
        3, description="With on_failure=resume, how many times at most."
    )
    on_nonfinite_loss: Literal["fail", "continue"] = Field(
        "fail",
        description="fail: a loss that is NaN or infinite ends the run, failed, with "
        "the step and stage in its message; continue: train on.",
    )
    worker_ids: list[WorkerId] | None = Field(
        None, max_length=10_000, description="Default: any online workers."
    )
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
    precision: Precision = Field(description="The arithmetic the run trains in, its plan's.")
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


class Compared(Public):
    """A time measured and predicted, from the profile and from the calibrated profile;
    errors are measured / predicted - 1 (null without a measurement)."""

    measured: float | None
    predicted: float
    calibrated: float
    predicted_error: float | None
    calibrated_error: float | None


class StageCompared(Compared):
    stage: int


class StageFactors(Public):
    stage: int
    measured_ms: dict[str, float]
    predicted_ms: dict[str, float]
    factors: dict[str, float]


class CalibratedProfilePublic(Public):
    """A run's profile calibrated from its measured ops (docs/simulator.md)."""

    run_id: int
    steps: list[int] = Field(description="First and last step calibrated from.")
    plan: dict[str, Any] = Field(description="The plan in effect over those steps.")
    profile: dict[str, Any] = Field(description="The calibrated profile.")
    cluster: dict[str, Any] | None = Field(
        description="The cluster with calibrated link bandwidths (null: free links)."
    )
    stages: list[StageFactors]
    link_gbps: dict[str, float]
    op_overhead_ms: float = Field(
        description="The engine's time between two compute ops, measured where nothing "
        "waits (the calibrated profile's op_overhead_ms, added to each forward, backward "
        "and weight-gradient op)."
    )
    core_wait: float = Field(
        description="How much longer compute takes for the waits for a core between ops "
        "when ranks outnumbered their host's cores (1: none)."
    )
    shared_cores: bool = Field(
        description="Some host ran more ranks than it has cores for their threads, or put "
        "several on one GPU: the prediction from the profile places them there, sharing."
    )
    step_ms: Compared
    stage_busy_ms: list[StageCompared] = Field(
        description="Compute per step of each stage (mean over its replicas)."
    )
    model_flops: int = Field(
        description="The model's forward and backward FLOPs per step, "
        "from the profile (0: it counts none)."
    )
    num_devices: int = Field(description="Devices the plan uses.")
    peak_tflops: float | None = Field(
        description="Each device's peak TFLOP/s in the plan's precision (null: unknown)."
    )
