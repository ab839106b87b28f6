"""``create_app(settings)``: the FastAPI application, its routers, errors and lifecycle.

On start it applies the Alembic migrations (``migrate_on_start``), then starts the ingest
writer and the worker watchdog. ``dashboard`` mounts a WSGI application (the Dash
dashboard) at ``dashboard_path``, so one process serves both.
"""

import logging
import secrets
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from pipestudio import __version__
from pipestudio.backend.context import AppContext
from pipestudio.backend.db import Database
from pipestudio.backend.errors import add_error_handlers
from pipestudio.backend.limits import BodyLimit
from pipestudio.backend.migrate import upgrade
from pipestudio.backend.routes import clusters, plans, profiles, proposals, runs, sockets, workers
from pipestudio.backend.settings import Settings

log = logging.getLogger("pipestudio.backend")

DESCRIPTION = """\
PipeStudio's store and switchboard: profiles, clusters, plans, runs, metrics, events and
proposals over REST; workers and live dashboards over websockets (`/ws/worker`,
`/ws/runs/{id}`). Mutating calls need `Authorization: Bearer <API token>`.
Times are milliseconds, sizes bytes."""


def create_app(settings: Settings | None = None, *, dashboard: Any = None,
               dashboard_path: str = "/") -> FastAPI:
    """The backend (see the module docstring); ``dashboard`` is an optional WSGI app."""
    settings = settings or Settings()
    if settings.api_token is None:
        settings = settings.model_copy(update={"api_token": secrets.token_urlsafe(24)})
    context = AppContext(settings=settings, db=Database(settings.database_url))

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if settings.migrate_on_start:
            upgrade(context.db.engine)
        await context.start()
        try:
            yield
        finally:
            await context.stop()

    app = FastAPI(title="PipeStudio", version=__version__, description=DESCRIPTION,
                  lifespan=lifespan)
    app.state.context = context
    app.state.settings = settings
    add_error_handlers(app)
    for module in (profiles, clusters, plans, runs, proposals):
        app.include_router(module.router)
    app.include_router(workers.router)
    app.include_router(workers.health)
    app.include_router(sockets.router)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(BodyLimit, max_bytes=settings.max_upload_bytes)
    if dashboard is not None:
        app.mount(dashboard_path, _wsgi(dashboard))
    return app


def _wsgi(wsgi_app: Any) -> Any:
    """A WSGI app as ASGI: a2wsgi when installed, else Starlette's (deprecated) adapter."""
    try:
        from a2wsgi import WSGIMiddleware
    except ImportError:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from starlette.middleware.wsgi import WSGIMiddleware
    return WSGIMiddleware(wsgi_app)
