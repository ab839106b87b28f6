"""``create_app(settings)``: the FastAPI application, its routers, errors and lifecycle.

On start it applies the Alembic migrations (``migrate_on_start``), then starts the ingest
writer and the worker watchdog. ``dashboard`` mounts a WSGI application (the Dash
dashboard) at ``dashboard_path``, so one process serves both; whatever lies under
``/api/`` and ``/ws/`` stays the API's, answering JSON 404 (or 405 naming the methods a
path has) rather than a dashboard page.
"""

import logging
import re
import secrets
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from pipestudio import __version__
from pipestudio.backend.apidocs import add_api_docs
from pipestudio.backend.context import AppContext
from pipestudio.backend.db import Database
from pipestudio.backend.errors import add_error_handlers
from pipestudio.backend.gate import CredentialsFirst
from pipestudio.backend.inputs import InputGuard
from pipestudio.backend.limits import BodyLimit
from pipestudio.backend.migrate import upgrade
from pipestudio.backend.openapi import openapi_builder
from pipestudio.backend.protocol import close_reason
from pipestudio.backend.routes import (
    auth,
    clusters,
    plans,
    profiles,
    proposals,
    runs,
    sockets,
    workers,
)
from pipestudio.backend.settings import Settings

log = logging.getLogger("pipestudio.backend")

DESCRIPTION = """\
PipeStudio's store and switchboard: profiles, clusters, plans, runs, metrics, events and
proposals over REST; workers and live dashboards over websockets (`/ws/worker`,
`/ws/runs/{id}`). Calls carry `Authorization: Bearer <credential>`: the API token, or a
session token from `POST /api/auth/session` (a person's name and password). Changes need
the API token or an editor's session; reads need any credential unless the server makes
reads public. Times are milliseconds, sizes bytes."""


def create_app(
    settings: Settings | None = None, *, dashboard: Any = None, dashboard_path: str = "/"
) -> FastAPI:
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

    app = FastAPI(
        title="PipeStudio",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    add_api_docs(app)  # /docs and /redoc with local assets
    app.state.context = context
    app.state.settings = settings
    app.openapi = openapi_builder(app)  # type: ignore[method-assign]
    add_error_handlers(app)
    routers = [
        *(module.router for module in (auth, profiles, clusters, plans, runs, proposals)),
        workers.router,
        workers.health,
        workers.links,
        sockets.router,
    ]
    for router in routers:
        app.include_router(router)
    _add_fallbacks(app)
    app.add_middleware(InputGuard)
    app.add_middleware(BodyLimit, max_bytes=settings.max_upload_bytes)
    # before any body is read (gate.py)
    app.add_middleware(CredentialsFirst, routes=[r for router in routers for r in router.routes])
    if settings.cors_origins:  # outermost: the guard's and the limit's answers get CORS too
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
        )
    if dashboard is not None:
        app.mount(dashboard_path, _wsgi(dashboard))
    return app


class _NoRoute:
    """The JSON answer for an API path no route takes, whatever the method (module
    docstring): 405 naming the methods the OpenAPI document gives the path, else 404."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.templates: list[tuple[re.Pattern[str], set[str]]] = []

    def methods_of(self, path: str) -> list[str]:
        """The methods of the OpenAPI path that ``path`` would be routed to (an integer
        parameter takes digits only, as the routes' ``:int`` convertors do)."""
        if not self.templates:
            for template, operations in self.app.openapi()["paths"].items():
                integers = {
                    param["name"]
                    for operation in operations.values()
                    for param in operation.get("parameters", [])
                    if param["in"] == "path" and param.get("schema", {}).get("type") == "integer"
                }
                pattern = re.sub(
                    r"\\\{([^}\\]*)\\\}", partial(_path_pattern, integers), re.escape(template)
                )
                self.templates.append(
                    (re.compile(f"^{pattern}$"), {method.upper() for method in operations})
                )
        return sorted(
            {m for pattern, methods in self.templates if pattern.match(path) for m in methods}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope)
        path = request.url.path
        allowed = self.methods_of(path)
        if allowed:
            response = JSONResponse(
                {
                    "detail": f"{request.method} is not allowed on {path}; "
                    f"it takes {', '.join(allowed)}"
                },
                status_code=405,
                headers={"Allow": ", ".join(allowed)},
            )
        elif path.startswith("/ws/"):
            response = JSONResponse(
                {"detail": f"{path} takes websocket connections only"}, status_code=404
            )
        else:
            response = JSONResponse({"detail": f"no API route {path}"}, status_code=404)
        await response(scope, receive, send)


def _path_pattern(integers: set[str], match: re.Match[str]) -> str:
    """What a path template's ``{name}`` matches: digits for an integer parameter."""
    return "[0-9]+" if match[1] in integers else "[^/]+"


def _add_fallbacks(app: FastAPI) -> None:
    """JSON answers for API paths no route takes (module docstring); registered after
    every route, so a route that matches path and method always wins."""
    answer = _NoRoute(app)
    for prefix in ("/api/", "/ws/"):
        app.router.routes.append(Route(prefix + "{path:path}", answer))

    @app.websocket("/{path:path}")
    async def no_socket(websocket: WebSocket, path: str) -> None:
        await websocket.accept()
        await websocket.close(1008, close_reason(f"no websocket at /{path}"))


def _wsgi(wsgi_app: Any) -> Any:
    """A WSGI app as ASGI: a2wsgi when installed, else Starlette's (deprecated) adapter."""
    try:
        from a2wsgi import WSGIMiddleware
    except ImportError:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from starlette.middleware.wsgi import WSGIMiddleware as Adapter
        return Adapter(wsgi_app)
    return WSGIMiddleware(wsgi_app)
