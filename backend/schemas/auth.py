"""Signing in: credentials in, a session token out; who the caller is."""

from datetime import datetime

from pydantic import BaseModel, Field

from pipestudio.backend.schemas.common import Request
from pipestudio.backend.users import MAX_PASSWORD_CHARS, Role


class SessionCreate(Request):
    """A person's name and password, or no name and the API token as the password."""

    user: str | None = Field(None, max_length=64, description="Empty: sign in with the API token.")
    password: str = Field(min_length=1, max_length=MAX_PASSWORD_CHARS)


class SessionPublic(BaseModel):
    """A new session: send ``token`` as ``Authorization: Bearer`` until ``expires_at``."""

    token: str
    user: str
    role: Role
    expires_at: datetime


class MePublic(BaseModel):
    """Who the credential of the request names (``user`` null without one), and whether
    this server lets anyone read."""

    user: str | None
    role: Role | None
    public_reads: bool
