"""Workers: registered agents, their devices and state; and the health answer."""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from pipestudio.backend.schemas.common import Public


class WorkerPublic(Public):
    id: str
    name: str
    host: str
    devices: list[dict[str, Any]]
    builtin_models: list[str]
    allowed_models: list[str]
    slots: int
    state: Literal["online", "offline"]
    connected_at: datetime
    last_seen_at: datetime
    created_at: datetime


class WorkersPublic(BaseModel):
    data: list[WorkerPublic]
    count: int


class HealthPublic(BaseModel):
    status: Literal["ok"]
    version: str
    database: str
    workers_online: int
