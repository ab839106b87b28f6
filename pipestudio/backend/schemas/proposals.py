"""Proposals: repartitions of a running job, approved or rejected."""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from pipestudio.backend.schemas.common import DbId, Public

ProposalState = Literal["pending", "approved", "rejected", "applied", "failed"]


class ProposalCreate(BaseModel):
    """Either an observed profile for the online planner to weigh (``replan``), or a
    Proposal document made elsewhere."""

    run_id: DbId
    observed_profile: dict[str, Any] | None = Field(None, description="A Profile document.")
    proposal: dict[str, Any] | None = Field(None, description="A Proposal document.")
    payback_steps: float = Field(100, gt=0)
    min_gain_fraction: float = Field(0.02, ge=0, lt=1)
    author: str = Field("online-planner", max_length=200)

    @model_validator(mode="after")
    def _one_source(self) -> "ProposalCreate":
        if (self.observed_profile is None) == (self.proposal is None):
            raise ValueError("give exactly one of observed_profile or proposal")
        return self


class ProposalDecision(BaseModel):
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
