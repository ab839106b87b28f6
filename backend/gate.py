"""Credentials before bodies: a request to an API route that needs a credential is answered
401 (or 403) before its body is read, parsed or checked, as the route itself would answer.

A route's need is the credential its dependencies ask for (``deps.require_writer``,
``deps.require_reader``); reads need none when the server makes them public, and routes
that ask for none (signing in) take anyone's body. So someone without a credential costs
the server no more than reading the request's headers, whatever body they send: the
checks of ``inputs.InputGuard`` and the routes' parsers see only bodies of someone the
route would serve. Routes still check who calls them; this only answers first.
"""

import json
from typing import Any, Literal

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security.utils import get_authorization_scheme_param
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from pipestudio.backend.auth import CredentialError
from pipestudio.backend.deps import (
    READER_NEEDED,
    WRITER_NEEDED,
    principal_of,
    require_reader,
    require_writer,
    viewer_refused,
)

Need = Literal["writer", "reader"] | None
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class CredentialsFirst:
    """ASGI middleware (module docstring) over the API's ``routes``."""

    def __init__(self, app: ASGIApp, routes: list[BaseRoute]) -> None:
        self.app = app
        self.needs = [(route, _need(route)) for route in routes if isinstance(route, APIRoute)]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] in _BODY_METHODS
            and scope["path"].startswith("/api/")
        ):
            answer = await self._refusal(scope)
            if answer is not None:
                await _answer(send, *answer)
                return
        await self.app(scope, receive, send)

    async def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        """The status and reason to answer at once, or None to let the request in."""
        app = scope["app"]
        need = next(
            (need for route, need in self.needs if route.matches(scope)[0] == Match.FULL), None
        )
        if need is None or (need == "reader" and app.state.settings.public_reads):
            return None
        value = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, token = get_authorization_scheme_param(value)
        if not token or scheme.lower() != "bearer":
            return 401, WRITER_NEEDED if need == "writer" else READER_NEEDED
        try:
            principal = await principal_of(app.state.context, token)
        except CredentialError as exc:
            return 401, str(exc)
        if need == "writer" and not principal.may_write:
            return 403, viewer_refused(principal)
        return None


def _need(route: APIRoute) -> Need:
    """What ``route``'s dependencies ask of its caller."""
    calls = _calls(route.dependant)
    return "writer" if require_writer in calls else "reader" if require_reader in calls else None


def _calls(dependant: Dependant) -> set[Any]:
    """Every function ``dependant`` depends on, however deep."""
    found: set[Any] = set()
    stack = list(dependant.dependencies)
    while stack:
        item = stack.pop()
        found.add(item.call)
        stack.extend(item.dependencies)
    return found


async def _answer(send: Send, status: int, reason: str) -> None:
    body = json.dumps({"detail": reason}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
