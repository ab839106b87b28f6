"""Credentials before bodies: an API request's body is read only when a route takes it, and
only from someone that route serves; everyone else is answered before it is read.

- A request no route reads a body from (no route matches its path and method, or the route
  matched takes no body) passes on unread: the router answers 404 or 405, or the route
  ignores the body, and ``inputs.InputGuard`` leaves it alone (``inputs.ROUTED_BODY``).
- A route's need is the credential its dependencies ask for (``deps.require_writer``,
  ``deps.require_reader``). Without it the request is answered 401 (or 403 for a viewer's
  change) at once, as the route itself would answer.
- Routes that take a body from anyone (signing in; the simulations when reads are public)
  take at most ``ANONYMOUS_BODY_BYTES`` from someone without a credential (413).

So someone without a credential costs the server no more than the request's headers and at
most ``ANONYMOUS_BODY_BYTES`` of body, whatever they send. Those who hold one send bodies
up to the upload limit, but at most ``LARGE_AT_ONCE`` larger than ``LARGE_BODY_BYTES`` are
taken at a time; the others wait their turn. Where a header is repeated, the
first counts, as it does for the routes (Starlette's ``Headers``).
"""

import asyncio
import json
from typing import Literal

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
from pipestudio.backend.inputs import ROUTED_BODY
from pipestudio.backend.limits import BodyLimit

Need = Literal["writer", "reader"] | None
#: The most body a request without a credential may send (signing in takes well under 1 KiB).
ANONYMOUS_BODY_BYTES = 1 << 20
#: Bodies longer than this (or of no stated length) are taken ``LARGE_AT_ONCE`` at a time:
#: parsing JSON costs memory many times its length (tens of bytes per byte for a body of
#: small values), so a few large requests at once could exhaust the server's memory.
LARGE_BODY_BYTES = 1 << 20
LARGE_AT_ONCE = 2


class CredentialsFirst:
    """ASGI middleware (module docstring) over the API's ``routes``."""

    def __init__(self, app: ASGIApp, routes: list[BaseRoute]) -> None:
        self.app = app
        #: Each route that takes a body, and the credential it needs.
        self.routes = [
            (route, _need(route))
            for route in routes
            if isinstance(route, APIRoute) and route.body_field is not None
        ]
        self.anonymous = BodyLimit(app, ANONYMOUS_BODY_BYTES, "from someone not signed in ")
        self.large = asyncio.Semaphore(LARGE_AT_ONCE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/api/") or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        needs = [need for route, need in self.routes if route.matches(scope)[0] == Match.FULL]
        if not needs:  # no route reads it (module docstring)
            await self.app(scope, receive, send)
            return
        answer, anonymous = await self._refusal(scope, needs[0])
        if answer is not None:
            await _answer(send, *answer)
            return
        scope[ROUTED_BODY] = True
        if anonymous:
            await self.anonymous(scope, receive, send)
            return
        length = _first(scope, b"content-length")
        if length.isdigit() and int(length) <= LARGE_BODY_BYTES:
            await self.app(scope, receive, send)
            return
        async with self.large:  # module docstring
            await self.app(scope, receive, send)

    async def _refusal(self, scope: Scope, need: Need) -> tuple[tuple[int, str] | None, bool]:
        """The status and reason to answer at once (None: let the request in), and whether
        the caller holds no credential."""
        app = scope["app"]
        scheme, token = get_authorization_scheme_param(_first(scope, b"authorization"))
        if not token or scheme.lower() != "bearer":
            if need is None or (need == "reader" and app.state.settings.public_reads):
                return None, True
            return (401, WRITER_NEEDED if need == "writer" else READER_NEEDED), True
        try:
            principal = await principal_of(app.state.context, token)
        except CredentialError as exc:
            return (401, str(exc)), True
        if need == "writer" and not principal.may_write:
            return (403, viewer_refused(principal)), False
        return None, False


def _need(route: APIRoute) -> Need:
    """What ``route``'s dependencies ask of its caller."""
    calls = _calls(route.dependant)
    return "writer" if require_writer in calls else "reader" if require_reader in calls else None


def _calls(dependant: Dependant) -> set[object]:
    """Every function ``dependant`` depends on, however deep."""
    found: set[object] = set()
    stack = list(dependant.dependencies)
    while stack:
        item = stack.pop()
        found.add(item.call)
        stack.extend(item.dependencies)
    return found


def _first(scope: Scope, name: bytes) -> str:
    """The first value of header ``name`` (lower case), or ''."""
    return next(
        (value.decode("latin-1") for key, value in scope["headers"] if key.lower() == name), ""
    )


def _has_body(scope: Scope) -> bool:
    length = _first(scope, b"content-length")
    return bool(_first(scope, b"transfer-encoding")) or (length != "" and length != "0")


async def _answer(send: Send, status: int, reason: str) -> None:
    body = json.dumps({"detail": reason}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
