"""What routes depend on: the application context, a database session, and who the request
acts for (``Principal``): ``Readable`` routes need a reader (anyone when reads are
public), ``Authorized`` ones and ``Writer`` parameters someone who may change things."""

from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated

from anyio import CancelScope, to_thread
from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from pipestudio.backend.auth import CredentialError
from pipestudio.backend.context import AppContext
from pipestudio.backend.db import finish
from pipestudio.backend.users import TOKEN_USER, Principal

_bearer = HTTPBearer(
    auto_error=False,
    description="The API token (PIPESTUDIO_API_TOKEN) or "
    "a session token from POST /api/auth/session.",
)


async def get_context(request: Request) -> AppContext:
    context: AppContext = request.app.state.context
    return context


ContextDep = Annotated[AppContext, Depends(get_context)]


async def get_session(context: ContextDep) -> AsyncIterator[Session]:
    """A session committed when the route returns, before its answer is sent: a client
    that reads right after a 201 finds what it created (``scope="function"``; the default
    scope would commit only after the response, racing the client's next request). A
    commit that fails then answers through the error handlers like any route error.

    Opening a session does no I/O, so it happens on the event loop; only the commit (or
    rollback) and close go to a worker thread, in one hop. A sync generator would cost a
    thread hop to open and another to close, each a wait for the GIL and the loop when
    the backend is busy."""
    session = context.db.factory()
    commit = False
    try:
        yield session
        commit = True
    finally:
        with CancelScope(shield=True):
            await to_thread.run_sync(partial(finish, session, commit=commit))


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _unauthorized(reason: str) -> HTTPException:
    return HTTPException(401, reason, headers={"WWW-Authenticate": "Bearer"})


async def principal_of(context: AppContext, token: str) -> Principal:
    """Who ``token`` names (the store is read in a thread, only when the cache does not
    know); ``CredentialError`` when it is not valid."""
    found = context.credentials.cached(token)
    if found is not None:
        return found
    return await to_thread.run_sync(context.credentials.resolve, token)


async def get_principal(context: ContextDep, credentials: BearerDep) -> Principal | None:
    """Who the bearer credential names; None without one; 401 for one that is not valid."""
    if credentials is None:
        return None
    try:
        return await principal_of(context, credentials.credentials)
    except CredentialError as exc:
        raise _unauthorized(str(exc)) from None


PrincipalDep = Annotated[Principal | None, Depends(get_principal)]


#: Why a change without a credential is refused (``gate.py`` answers the same).
WRITER_NEEDED = (
    "a valid API token is required: send 'Authorization: Bearer "
    "<token>' (the API token, or a session token of an editor)"
)


#: Why a read without a credential is refused where reads are not public.
READER_NEEDED = (
    "sign in first: send 'Authorization: Bearer <API token or "
    "session token>' (reads are not public on this server)"
)


def viewer_refused(principal: Principal) -> str:
    """Why a change by someone who may only read is refused."""
    return f"{principal.user} is a {principal.role}: viewers may read but not change anything"


async def require_reader(context: ContextDep, principal: PrincipalDep) -> Principal | None:
    """Reads need a credential unless ``public_reads`` is set."""
    if principal is None and not context.settings.public_reads:
        raise _unauthorized(READER_NEEDED)
    return principal


async def require_writer(principal: PrincipalDep) -> Principal:
    """Changes need the API token or a person whose role may write."""
    if principal is None:
        raise _unauthorized(WRITER_NEEDED)
    if not principal.may_write:
        raise HTTPException(403, viewer_refused(principal))
    return principal


Writer = Annotated[Principal, Depends(require_writer)]
Authorized = Depends(require_writer)
Readable = Depends(require_reader)


def author(principal: Principal, given: str) -> str:
    """Who a change is recorded as: the signed-in person; a script holding the API token
    may name itself (``given``)."""
    return given if principal.user == TOKEN_USER else principal.user
