"""Plans: made by a planner or by hand, simulated, compared, edited, approved."""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from pipestudio.backend.schemas.common import DbId, Public

Schedule = Literal["gpipe", "1f1b", "pipedream"]
Optimizer = Literal["sgd", "momentum", "adam"]
Policy = Literal["keep", "recompute", "swap"]
PlanState = Literal["draft", "approved", "launched"]


class PlannerParameters(BaseModel):
    """What a planner is asked (as ``pipestudio plan``)."""

    num_stages: int | None = Field(None, ge=1, description="Stages (devices for optimal).")
    num_microbatches: int = Field(ge=1, le=100_000)
    schedule: Schedule
    microbatch_size: int | None = Field(None, ge=1, description="Default: the profile's.")
    optimizer: Optimizer = "adam"
    straight: bool = Field(False, description="No replicated stages (optimal, pipedream).")
    device_memory_bytes: int | None = Field(
        None, ge=1, description="Without a cluster: memory per device, links free.")


class PlannerRequest(PlannerParameters):
    algorithm: str = Field(description="A planner: uniform, balance-time, pipedream, ...")


class ManualPlan(BaseModel):
    """A plan by hand: the first layer index of every stage after the first, and policies."""

    boundaries: list[int] = Field(description="Layer indices where stages 1.. begin, rising.")
    num_microbatches: int = Field(ge=1, le=100_000)
    schedule: Schedule
    microbatch_size: int | None = Field(None, ge=1, description="Default: the profile's.")
    optimizer: Optimizer = "adam"
    policies: dict[str, Policy] = Field(default_factory=dict, description="Layer -> policy.")


class PlanSource(BaseModel):
    """Exactly one of ``planner``, ``manual`` or ``plan`` (a whole Plan document)."""

    profile_id: DbId
    cluster_id: DbId | None = None
    planner: PlannerRequest | None = None
    manual: ManualPlan | None = None
    plan: dict[str, Any] | None = Field(None, description="A Plan document.")

    @model_validator(mode="after")
    def _one_source(self) -> "PlanSource":
        given = [name for name in ("planner", "manual", "plan") if getattr(self, name)]
        if len(given) != 1:
            raise ValueError("give exactly one of planner, manual or plan; got "
                             f"{', '.join(given) or 'none'}")
        return self


class PlanCreate(PlanSource):
    name: str | None = Field(None, max_length=200)
    author: str = Field("api", max_length=200, description="Who makes the plan.")


class PlanUpdate(BaseModel):
    """Changes to a draft plan: stage boundaries, policies, shape, or the whole document;
    or a state change (``draft`` <-> ``approved``)."""

    name: str | None = Field(None, max_length=200)
    boundaries: list[int] | None = None
    policies: dict[str, Policy] | None = None
    num_microbatches: int | None = Field(None, ge=1, le=100_000)
    schedule: Schedule | None = None
    microbatch_size: int | None = Field(None, ge=1)
    plan: dict[str, Any] | None = None
    state: Literal["draft", "approved"] | None = None
    author: str = Field("api", max_length=200)


class PlanSummary(BaseModel):
    """The simulated figures of a plan (the SimResult without its timelines)."""

    step_time_ms: float
    samples_per_s: float
    bubble_fraction: float
    fits: bool
    stage_busy_ms: list[float]
    stage_peak_bytes: list[int]
    stage_device_memory_bytes: list[int | None]


class PlanPublic(Public):
    id: int
    name: str
    profile_id: int
    cluster_id: int | None
    state: PlanState
    planner: str
    parameters: dict[str, Any]
    created_by: str
    created_at: datetime
    updated_at: datetime
    approved_at: datetime | None
    summary: PlanSummary | None
    document: dict[str, Any]


class PlansPublic(BaseModel):
    data: list[PlanPublic]
    count: int


class SimulateRequest(BaseModel):
    steps: int = Field(2, ge=1, le=20, description="Steps simulated (the first is warm-up).")
    with_timeline: bool = True


class PreviewRequest(PlanSource):
    """Simulate a plan without storing it (what the dashboard does while dragging)."""

    steps: int = Field(2, ge=1, le=20)
    with_timeline: bool = True


class CompareRequest(PlannerParameters):
    profile_id: DbId
    cluster_id: DbId | None = None
    algorithms: list[str] | None = Field(None, description="Default: every planner.")
    save: bool = Field(False, description="Store every plan found as a draft.")
    author: str = Field("api", max_length=200)


class CompareRow(BaseModel):
    algorithm: str
    plan_id: int | None
    plan: dict[str, Any] | None
    summary: PlanSummary | None
    planner_ms: float | None
    objective_ms: float | None
    error: str | None
    min_memory_bytes: int | None


class ComparePublic(BaseModel):
    rows: list[CompareRow]
