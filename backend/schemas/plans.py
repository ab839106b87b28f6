"""Plans: made by a planner or by hand, simulated, compared, edited, approved."""

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field

from pipestudio.backend.schemas.common import DbId, Public, Request, choice, one_of
from pipestudio.planner import Plan
from pipestudio.planner.formats.documents import (
    MAX_LAYERS,
    MAX_NAME_CHARS,
    Integral,
    MicrobatchSize,
    NumMicrobatches,
    Precision,
)

Schedule = Literal["gpipe", "1f1b", "pipedream", "interleaved-1f1b", "zero-bubble"]
#: What a planner is asked for: a schedule it plans, or ``auto`` (``algorithms/schedules.py``).
PlannerSchedule = Literal["gpipe", "1f1b", "pipedream", "interleaved-1f1b", "zero-bubble", "auto"]
Optimizer = Literal["sgd", "momentum", "adam"]
Policy = Literal["keep", "recompute", "swap"]
PlanState = Literal["draft", "approved", "launched"]
LayerName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
Boundaries = Annotated[
    list[Annotated[int, Field(ge=1, le=MAX_LAYERS), Integral]], Field(max_length=MAX_LAYERS)
]
Policies = Annotated[dict[LayerName, Policy], Field(max_length=MAX_LAYERS)]
Steps = Annotated[int, Field(ge=1, le=20), Integral]


class PlannerParameters(Request):
    """What a planner is asked (as ``pipestudio plan``)."""

    num_stages: Annotated[int, Field(ge=1, le=MAX_LAYERS), Integral] | None = Field(
        None, description="Stages (devices for optimal)."
    )
    num_microbatches: NumMicrobatches
    schedule: PlannerSchedule = Field(
        description="gpipe, 1f1b or pipedream; auto: the fastest fitting of the synchronous "
        "schedules for the planner's splits (docs/planners.md). The planners do not plan "
        "interleaved-1f1b or zero-bubble themselves (422)."
    )
    microbatch_size: MicrobatchSize | None = Field(None, description="Default: the profile's.")
    optimizer: Optimizer = "adam"
    straight: bool = Field(False, description="No replicated stages (optimal, pipedream).")
    device_memory_bytes: Annotated[int, Field(ge=1, le=2**53), Integral] | None = Field(
        None, description="Without a cluster: memory per device, links free."
    )


class PlannerRequest(PlannerParameters):
    algorithm: str = Field(
        max_length=50, description="A planner: uniform, balance-time, pipedream, ..."
    )


class ManualPlan(Request):
    """A plan by hand: the first layer index of every stage after the first, and policies."""

    boundaries: Boundaries = Field(description="Layer indices where stages 1.. begin, rising.")
    num_microbatches: NumMicrobatches
    schedule: Schedule
    virtual_stages: Annotated[int, Field(ge=1, le=MAX_LAYERS), Integral] = Field(
        1,
        description="interleaved-1f1b: chunks per device; the boundaries cut devices x "
        "virtual_stages chunks, chunk c on device c mod devices.",
    )
    microbatch_size: MicrobatchSize | None = Field(None, description="Default: the profile's.")
    optimizer: Optimizer = "adam"
    policies: Policies = Field(default_factory=dict, description="Layer -> policy.")


class _Source(Request):
    """Where a plan comes from: a stored profile (and cluster), and exactly one of a
    planner's answer, boundaries by hand, or a whole Plan document."""

    profile_id: DbId
    cluster_id: DbId | None = None


class ByPlanner(_Source):
    source_kind: ClassVar[str] = "planner"
    planner: PlannerRequest


class ByHand(_Source):
    source_kind: ClassVar[str] = "manual"
    manual: ManualPlan


class ByDocument(_Source):
    source_kind: ClassVar[str] = "plan"
    plan: Plan = Field(description="A Plan document.")


PlanSource = ByPlanner | ByHand | ByDocument
_ONE_SOURCE = "give exactly one of planner, manual or plan"


class _Creation(Request):
    name: str | None = Field(None, max_length=200)
    author: str = Field("api", max_length=200, description="Who makes the plan.")


class PlanFromPlanner(ByPlanner, _Creation):
    pass


class PlanByHand(ByHand, _Creation):
    pass


class PlanFromDocument(ByDocument, _Creation):
    pass


AnyPlanCreate = PlanFromPlanner | PlanByHand | PlanFromDocument
PlanCreate = one_of(
    (PlanFromPlanner, "planner"),
    (PlanByHand, "manual"),
    (PlanFromDocument, "plan"),
    tag=choice("planner", "manual", "plan"),
    what=_ONE_SOURCE,
)


class PlanUpdate(Request):
    """Changes to a draft plan: stage boundaries, policies, shape, or the whole document;
    or a state change (``draft`` <-> ``approved``)."""

    name: str | None = Field(None, max_length=200)
    boundaries: Boundaries | None = None
    policies: Policies | None = None
    num_microbatches: NumMicrobatches | None = None
    schedule: Schedule | None = None
    microbatch_size: MicrobatchSize | None = None
    plan: Plan | None = Field(None, description="A whole Plan document.")
    state: Literal["draft", "approved"] | None = None
    force: bool = Field(
        False,
        description=(
            "Approve even when the plan does not fit its cluster's memory or needs more ranks "
            "than its cluster's devices or the online workers' slots (else 422 naming why)."
        ),
    )
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
    device_peak_bytes: list[int] = Field(
        default_factory=list,
        description="Each device's peak, its stages together (interleaved: its chunks); "
        "index: device.",
    )


class PlanPublic(Public):
    id: int
    name: str
    profile_id: int
    cluster_id: int | None
    state: PlanState
    precision: Precision = Field(description="The arithmetic the plan trains in, its profile's.")
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


class SimulateRequest(Request):
    steps: Steps = Field(2, description="Steps simulated (the first is warm-up).")
    with_timeline: bool = True


class _Preview(Request):
    """Simulate a plan without storing it (what the dashboard does while dragging)."""

    steps: Steps = 2
    with_timeline: bool = True


class PreviewFromPlanner(ByPlanner, _Preview):
    pass


class PreviewByHand(ByHand, _Preview):
    pass


class PreviewFromDocument(ByDocument, _Preview):
    pass


AnyPreviewRequest = PreviewFromPlanner | PreviewByHand | PreviewFromDocument
PreviewRequest = one_of(
    (PreviewFromPlanner, "planner"),
    (PreviewByHand, "manual"),
    (PreviewFromDocument, "plan"),
    tag=choice("planner", "manual", "plan"),
    what=_ONE_SOURCE,
)


class CompareRequest(PlannerParameters):
    profile_id: DbId
    cluster_id: DbId | None = None
    algorithms: list[Annotated[str, Field(max_length=50)]] | None = Field(
        None, max_length=50, description="Default: every planner."
    )
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
