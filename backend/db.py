"""The database connection: engine, sessions, SQLite in WAL mode, PostgreSQL through psycopg 3.

SQLite runs in write-ahead-log mode so that readers (the dashboard, REST) never wait for
the writer (metric ingest), with ``synchronous=NORMAL`` (a commit survives a process
crash; WAL keeps the file consistent) and foreign keys on. ``postgresql://`` URLs get the
psycopg 3 driver.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker


class DatabaseUrlError(ValueError):
    """The database URL names no supported database."""


def normalize_url(url: str) -> URL:
    """``postgresql://`` and ``postgres://`` -> ``postgresql+psycopg://``; SQLite as is."""
    try:
        parsed = make_url(
            url.replace("postgres://", "postgresql://", 1) if url.startswith("postgres://") else url
        )
    except Exception as exc:
        raise DatabaseUrlError(f"database URL {url!r} is not understood: {exc}") from None
    if parsed.drivername in ("postgresql", "postgresql+psycopg"):
        return parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername == "sqlite":
        return parsed
    raise DatabaseUrlError(
        f"database URL {url!r}: expected sqlite:///FILE or postgresql://USER@HOST/DB"
    )


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    for pragma in (
        "journal_mode=WAL",
        "synchronous=NORMAL",
        "foreign_keys=ON",
        "busy_timeout=30000",
    ):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


def make_engine(url: str) -> Engine:
    parsed = normalize_url(url)
    if parsed.drivername == "sqlite":
        in_memory = not parsed.database or parsed.database == ":memory:"
        if not in_memory:
            Path(str(parsed.database)).parent.mkdir(parents=True, exist_ok=True)
        pool: dict[str, Any] = {} if in_memory else {"pool_size": 20, "max_overflow": 20}
        engine = create_engine(parsed, connect_args={"check_same_thread": False}, **pool)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(parsed, pool_size=20, max_overflow=20, pool_pre_ping=True)


def finish(session: Session, *, commit: bool) -> None:
    """Commit (or roll back) and close ``session``; closed even when the commit fails."""
    try:
        if commit:
            session.commit()
        else:
            session.rollback()
    finally:
        session.close()


class Database:
    """The engine and a session factory; ``session()`` commits or rolls back."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)
        self.factory = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        session = self.factory()
        try:
            yield session
        except BaseException:
            finish(session, commit=False)
            raise
        finish(session, commit=True)

    def dispose(self) -> None:
        self.engine.dispose()
