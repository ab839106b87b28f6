"""Proposals: repartitions of a running job, approved or rejected."""

from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from pipestudio.backend.schemas.common import DbId, Public, Request, choice, one_of
from pipestudio.planner import Cluster, Profile
from pipestudio.planner.formats.proposal import Proposal

#: ``closed``: never to be decided (its run ended first, or it changes nothing).
ProposalState = Literal["pending", "approved", "rejected", "applied", "failed", "closed"]


class _ProposalSource(Request):
    run_id: DbId
    author: str = Field("online-planner", max_length=200)


class ObservedProfile(_ProposalSource):
    """A profile measured while the run trains, for the online planner to weigh
    (``replan``) against the plan the run trains now (its migrations applied)."""

    source_kind: ClassVar[str] = "observed_profile"
    observed_profile: Profile = Field(description="A Profile document.")
    cluster: Cluster | None = Field(
        None,
        description="The cluster to weigh it on (default: the plan's). The calibrated-profile "
        "answer's cluster has the links the run measured: with it, the proposal starts from "
        "the step the calibration predicts.",
    )
    payback_steps: float = Field(100, gt=0, le=1e9, allow_inf_nan=False)
    min_gain_fraction: float = Field(0.02, ge=0, lt=1)


class ProposalDocument(_ProposalSource):
    """A Proposal document made elsewhere."""

    source_kind: ClassVar[str] = "proposal"
    proposal: Proposal = Field(description="A Proposal document.")


AnyProposalCreate = ObservedProfile | ProposalDocument
ProposalCreate = one_of(
    (ObservedProfile, "observed_profile"),
    (ProposalDocument, "proposal"),
    tag=choice("observed_profile", "proposal"),
    what="give exactly one of observed_profile or proposal",
)


class ProposalDecision(Request):
    author: str = Field("api", max_length=200, description="Who decides.")


class ProposalPublic(Public):
    id: int
    run_id: int
    state: ProposalState
    worthwhile: bool
    gain_ms: float
    outcome: str | None
    created_by: str
    decided_by: str | None
    created_at: datetime
    decided_at: datetime | None
    document: dict[str, Any]


class ProposalsPublic(BaseModel):
    data: list[ProposalPublic]
    count: int
