"""Alembic's entry point: migrate the connection the backend hands over, or the database
``PIPESTUDIO_DATABASE_URL`` names when run from the ``alembic`` command."""

from alembic import context
from sqlalchemy import Connection

from pipestudio.backend.db import make_engine
from pipestudio.backend.models import Base
from pipestudio.backend.settings import Settings

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = make_engine(Settings().database_url)
    with engine.begin() as new_connection:
        _run(new_connection)
    engine.dispose()
