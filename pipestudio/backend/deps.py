"""What routes depend on: the application context, a database session, the API token."""

import secrets
from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated

from anyio import CancelScope, to_thread
from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from pipestudio.backend.context import AppContext
from pipestudio.backend.db import finish

_bearer = HTTPBearer(auto_error=False, description="The API token (PIPESTUDIO_API_TOKEN).")


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


async def require_token(context: ContextDep, credentials: Annotated[
        HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """Mutating calls carry ``Authorization: Bearer <API token>``."""
    token = context.settings.api_token
    if credentials is None or token is None or not secrets.compare_digest(
            credentials.credentials.encode(), token.encode()):
        raise HTTPException(401, "a valid API token is required: send "
                                 "'Authorization: Bearer <token>'",
                            headers={"WWW-Authenticate": "Bearer"})


Authorized = Depends(require_token)
