"""Alembic: the migrations build exactly the ORM models, and go down and up again."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from pipestudio.backend.db import make_engine
from pipestudio.backend.migrate import downgrade, upgrade
from pipestudio.backend.models import Base


def _differences(url: str) -> list[object]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def test_upgrade_head_matches_the_models(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine)
    engine.dispose()
    assert _differences(database_url) == []


def test_downgrade_and_upgrade_round_trip(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine)
    downgrade(engine, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade(engine)
    assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    engine.dispose()
    assert _differences(database_url) == []


def test_an_empty_database_differs() -> None:
    """The comparison sees missing tables (so the tests above can fail)."""
    assert _differences("sqlite://")
