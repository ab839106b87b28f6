"""The backend's configuration, read from ``PIPESTUDIO_*`` environment variables."""

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from pipestudio.backend.users import parse_users
from pipestudio.planner import DEFAULT_MAX_SIMULATED_OPS

DEFAULT_DATABASE_URL = f"sqlite:///{Path('.pipestudio') / 'pipestudio.db'}"
ENV_PREFIX = "PIPESTUDIO_"


class SettingsError(ValueError):
    """A ``PIPESTUDIO_*`` variable (or a command-line override) holds a refused value."""


class Settings(BaseSettings):
    """Every setting has an environment variable: ``database_url`` is
    ``PIPESTUDIO_DATABASE_URL`` and so on. ``cors_origins`` reads a comma-separated list."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    database_url: str = Field(
        DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL: sqlite:///FILE or postgresql://USER@HOST/DB (psycopg 3).",
    )
    api_token: str | None = Field(
        None, description="Bearer token of mutating API calls; None = a random one per start."
    )
    worker_token: str | None = Field(
        None, description="Token workers present on /ws/worker; None = the API token."
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Origins allowed to call the API from a browser."
    )
    max_upload_bytes: int = Field(32 * 2**20, ge=1, description="Largest request body.")
    worker_timeout_s: float = Field(
        10.0, gt=0, description="A worker silent this long is offline; its runs fail."
    )
    heartbeat_s: float = Field(2.0, gt=0, description="How often workers send heartbeats.")
    checkpoint_dir: str | None = Field(
        None,
        description="Where runs keep checkpoints, each in run-<id>/: a path every worker "
        "reaches under the same name (a shared filesystem when workers are on several "
        "machines). None: runs cannot checkpoint, nor resume after a failure.",
    )
    resume_wait_s: float = Field(
        60.0,
        gt=0,
        description="How long a run that resumes after a failure waits for "
        "enough free slots on connected workers before it fails.",
    )
    migrate_on_start: bool = Field(True, description="Apply Alembic migrations on start.")
    users: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="People who may sign in besides the API token: "
        "comma-separated NAME:ROLE:HASH entries, ROLE editor (may change things) or viewer "
        "(reads only), HASH from `pipestudio hash-password`.",
    )
    public_reads: bool = Field(
        False,
        description="Let anyone who reaches the server read (REST GETs, the run "
        "stream, the dashboard's pages) without signing in; changes still need a credential.",
    )
    session_ttl_s: float = Field(
        12 * 3600.0,
        gt=0,
        le=90 * 86400.0,
        description="How long a sign-in lasts (the dashboard's session, or an API session).",
    )
    cookie_secure: bool = Field(
        False,
        description="Mark the dashboard's cookies Secure (send them over HTTPS only); "
        "set it when the dashboard is served over HTTPS.",
    )
    worker_retention_s: float = Field(
        86400.0,
        gt=0,
        description="Offline workers last heard from longer ago than this "
        "are left out of worker lists (their records stay, for the runs that used them).",
    )
    auto_propose_drift: float = Field(
        0.15,
        ge=0,
        le=100,
        description="Propose a repartition by itself when a running "
        "job's measured step is off its plan's prediction by more than this fraction (and "
        "the online planner finds one worth making).",
    )
    auto_propose_every_s: float = Field(
        10.0,
        ge=0,
        le=86400,
        description="How often running jobs are checked for such a "
        "proposal; 0 turns proposals that come by themselves off.",
    )
    max_simulated_ops: int = Field(
        DEFAULT_MAX_SIMULATED_OPS,
        ge=1_000,
        le=100_000_000,
        description="Work budget of "
        "one simulation or planner request: the schedule operations its simulation may "
        "build (about 8 us and 2 KB each; 422 beyond, naming the field and the limit).",
    )

    @field_validator("cors_origins", "users", mode="before")
    @classmethod
    def _split_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip() for item in value.replace("\n", ",").split(",") if item.strip()]
        return value

    @field_validator("users")
    @classmethod
    def _check_users(cls, value: list[str]) -> list[str]:
        parse_users(value)  # raises ValueError naming the bad entry
        return value

    @property
    def effective_worker_token(self) -> str | None:
        return self.worker_token or self.api_token


def load_settings(**overrides: Any) -> Settings:
    """The settings from the environment with ``overrides`` (from command-line options)
    applied; a refused value raises ``SettingsError`` naming the variable (or the option)
    and the reason, in one line."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        reasons = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "?"
            name = (
                f"--{field.replace('_', '-')}"
                if field in overrides
                else f"{ENV_PREFIX}{field.upper()}"
            )
            shown = "" if field == "users" else f"={error.get('input')!r}"  # hashes stay
            reasons.append(f"{name}{shown}: {error['msg']}")
        raise SettingsError("; ".join(reasons)) from None
