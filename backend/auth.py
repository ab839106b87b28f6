"""Who a request acts for: the bearer credential (the API token or a session token) turned
into a ``Principal``, with a short cache, and the brake on guessing passwords.

A session token is looked up in the store once and then trusted for ``_CACHE_S`` seconds
(never past its expiry); signing out here drops it from the cache at once, and another
backend process sharing the database notices within ``_CACHE_S``.
"""

import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from pipestudio.backend import models
from pipestudio.backend.db import Database
from pipestudio.backend.services import sessions
from pipestudio.backend.users import TOKEN_USER, Principal, User

_CACHE_S = 5.0
_CACHE_MAX = 10_000
#: Failed sign-ins one client may make in ``_WINDOW_S`` before it must wait.
_MAX_FAILURES = 10
_WINDOW_S = 300.0


class CredentialError(ValueError):
    """A credential was given but is not valid (wrong, expired or signed out)."""


@dataclass
class Throttle:
    """Sign-in attempts per client address in a sliding window: an attempt counts from
    the moment it begins (so a burst of parallel guesses gets no more than a slow
    series) and is forgotten when it succeeds."""

    attempts: dict[str, deque[float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(self, client: str) -> float:
        """Count an attempt of ``client`` and return 0, or the seconds it must wait first
        (the attempt is then not made, nor counted)."""
        now = time.monotonic()
        with self.lock:
            if len(self.attempts) > _CACHE_MAX:
                self.attempts.clear()
            recent = self.attempts.setdefault(client, deque())
            while recent and recent[0] < now - _WINDOW_S:
                recent.popleft()
            if len(recent) >= _MAX_FAILURES:
                return recent[0] + _WINDOW_S - now
            recent.append(now)
            return 0.0

    def succeeded(self, client: str) -> None:
        with self.lock:
            recent = self.attempts.get(client)
            if recent:
                recent.pop()


@dataclass
class Credentials:
    """Resolves bearer credentials for one backend (``AppContext.credentials``)."""

    api_token: str | None
    users: dict[str, User]
    db: Database
    throttle: Throttle = field(default_factory=Throttle)
    _cache: dict[str, tuple[Principal, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def is_api_token(self, token: str) -> bool:
        return self.api_token is not None and secrets.compare_digest(
            token.encode(), self.api_token.encode()
        )

    def issuer(self, user: str) -> str | None:
        """The digest of the credential ``user`` signs in with now (the API token, or the
        person's password hash); None when ``user`` may no longer sign in."""
        if user == TOKEN_USER:
            secret = self.api_token
        else:
            person = self.users.get(user)
            secret = person.password_hash if person is not None else None
        return None if secret is None else sessions.token_digest(secret)

    def cached(self, token: str) -> Principal | None:
        """The principal of ``token`` without touching the store, when known."""
        if self.is_api_token(token):
            return Principal(TOKEN_USER, "admin")
        with self._lock:
            hit = self._cache.get(token)
        if hit is not None and hit[1] > time.monotonic():
            return hit[0]
        return None

    def resolve(self, token: str) -> Principal:
        """The principal of ``token``, read from the store (blocking; ``cached`` first);
        ``CredentialError`` when it is not valid."""
        with self.db.session() as session:
            row = sessions.find_session(session, token)
            if row is None or row.issuer_sha256 != self.issuer(row.user):
                raise CredentialError("the credential is not valid: sign in again")
            person = self.users.get(row.user)
            principal = Principal(row.user, person.role if person else "admin")
            left_s = (row.expires_at - models.utcnow()).total_seconds()
        with self._lock:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[token] = (principal, time.monotonic() + min(_CACHE_S, left_s))
        return principal

    def forget(self, token: str) -> None:
        with self._lock:
            self._cache.pop(token, None)
