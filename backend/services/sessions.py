"""Signing in and out: a person (or the API token) trades a password for a session token.

A session token is 32 random bytes shown once; the store keeps only its SHA-256, so a copy
of the database signs nobody in. The dashboard keeps the token in an HttpOnly cookie and
sends it as ``Authorization: Bearer`` on every API call it makes for that person.
"""

import hashlib
import secrets
from datetime import timedelta
from functools import cache

from sqlalchemy import delete
from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.users import (
    TOKEN_USER,
    Principal,
    User,
    check_password,
    hash_password,
)


@cache
def _decoy() -> str:
    """What an unknown name's password is checked against (no password matches it)."""
    return hash_password(secrets.token_urlsafe(16))


class SignInError(ValueError):
    """The name, password or token is wrong (deliberately not saying which)."""


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def authenticate(
    users: dict[str, User], api_token: str | None, *, user: str | None, password: str
) -> Principal:
    """The principal these credentials name: the API token (``user`` empty) or a person."""
    if not user:
        if api_token is not None and secrets.compare_digest(password.encode(), api_token.encode()):
            return Principal(TOKEN_USER, "admin")
        raise SignInError("the API token is wrong")
    found = users.get(user)
    # an unknown name costs a hash too, so that the answer's time does not tell who exists
    if not check_password(password, found.password_hash if found else _decoy()) or not found:
        raise SignInError("the name or the password is wrong")
    return Principal(found.name, found.role)


def open_session(
    session: Session, principal: Principal, issuer: str, ttl_s: float
) -> tuple[str, models.UserSession]:
    """A new session for ``principal``, made with the credential whose digest is
    ``issuer``; the token is returned here and nowhere else."""
    session.execute(
        delete(models.UserSession).where(models.UserSession.expires_at < models.utcnow())
    )
    token = secrets.token_urlsafe(32)
    row = models.UserSession(
        token_sha256=token_digest(token),
        user=principal.user,
        role=principal.role,
        issuer_sha256=issuer,
        expires_at=models.utcnow() + timedelta(seconds=ttl_s),
    )
    session.add(row)
    session.flush()
    return token, row


def find_session(session: Session, token: str) -> models.UserSession | None:
    """The live session of ``token``, if any."""
    row = session.get(models.UserSession, token_digest(token))
    if row is None or row.expires_at <= models.utcnow():
        return None
    return row


def close_session(session: Session, token: str) -> bool:
    """End the session of ``token``; whether there was one."""
    result = session.execute(
        delete(models.UserSession).where(models.UserSession.token_sha256 == token_digest(token))
    )
    return bool(getattr(result, "rowcount", 0))
