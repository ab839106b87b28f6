"""/api/auth: sign in (a session token for a person or the API token), who am I, sign out."""

from fastapi import APIRouter, HTTPException, Request

from pipestudio.backend.auth import CredentialError
from pipestudio.backend.deps import BearerDep, ContextDep, SessionDep, principal_of
from pipestudio.backend.schemas.auth import MePublic, SessionCreate, SessionPublic
from pipestudio.backend.schemas.common import ERRORS
from pipestudio.backend.services import sessions as service

router = APIRouter(prefix="/api/auth", tags=["auth"], responses=ERRORS)


@router.post(
    "/session",
    status_code=201,
    responses={
        429: {"description": "Too many failed sign-ins from this address; wait Retry-After."}
    },
)
def sign_in(
    session: SessionDep, context: ContextDep, request: Request, data: SessionCreate
) -> SessionPublic:
    """Trade a name and password (or the API token) for a session token. Ten failed
    attempts from one address within five minutes make it wait (429). The address is the
    peer's, or the one a proxy the server trusts forwarded (uvicorn's
    ``--forwarded-allow-ips``, loopback by default: the dashboard in the same process
    forwards each browser's)."""
    client = request.client.host if request.client else "unknown"
    throttle = context.credentials.throttle
    wait_s = throttle.begin(client)
    if wait_s > 0:
        raise HTTPException(
            429,
            f"too many failed sign-ins from {client}; try again in {wait_s:.0f} s",
            headers={"Retry-After": f"{wait_s:.0f}"},
        )
    try:
        principal = service.authenticate(
            context.credentials.users,
            context.credentials.api_token,
            user=data.user,
            password=data.password,
        )
    except service.SignInError as exc:
        raise HTTPException(401, str(exc)) from None
    throttle.succeeded(client)
    issuer = context.credentials.issuer(principal.user)
    assert issuer is not None, "who just signed in may sign in"
    token, row = service.open_session(session, principal, issuer, context.settings.session_ttl_s)
    return SessionPublic(token=token, user=row.user, role=principal.role, expires_at=row.expires_at)


@router.get("/me")
async def who_am_i(context: ContextDep, request: Request) -> MePublic:
    """Who the request's credential names (``user`` null without one; 401 for one that
    is not valid), and whether reads are public. Anyone may ask: it is how a client learns
    whether it must sign in."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    principal = None
    if scheme.lower() == "bearer" and token.strip():
        try:
            principal = await principal_of(context, token.strip())
        except CredentialError as exc:
            raise HTTPException(401, str(exc), headers={"WWW-Authenticate": "Bearer"}) from None
    return MePublic(
        user=principal.user if principal else None,
        role=principal.role if principal else None,
        public_reads=context.settings.public_reads,
    )


@router.delete("/session", status_code=204)
def sign_out(session: SessionDep, context: ContextDep, credentials: BearerDep) -> None:
    """End the session whose token the request carries (401 when it carries none that
    is live)."""
    token = credentials.credentials if credentials else ""
    context.credentials.forget(token)
    if not token or not service.close_session(session, token):
        raise HTTPException(
            401,
            "the request carries no live session token to end",
            headers={"WWW-Authenticate": "Bearer"},
        )
