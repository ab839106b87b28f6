"""Who may sign in: the configured people (``PIPESTUDIO_USERS``), their roles and password
hashes, and the principal a request acts as.

Roles: ``admin`` is whoever holds the API token (everything), ``editor`` may change
things, ``viewer`` may only read. A configured entry reads ``NAME:ROLE:HASH``, where HASH
is ``scrypt$N$r$p$SALT$KEY`` (base64 salt and key), as ``pipestudio hash-password`` prints
it: scrypt makes each guess cost memory as well as time, and only the hash is configured.
"""

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Literal

Role = Literal["admin", "editor", "viewer"]
ROLES: tuple[str, ...] = ("editor", "viewer")
#: Roles that may change what is stored.
WRITERS: tuple[str, ...] = ("admin", "editor")
#: The principal the API token signs in as.
TOKEN_USER = "api-token"
MAX_PASSWORD_CHARS = 1024
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
#: scrypt's cost: 2**14 x 8 x 128 bytes = 16 MiB and about 50 ms per guess; a configured
#: hash may ask for up to 64 MiB.
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 2**14, 8, 1
_MAX_SCRYPT_BYTES = 2**26


class UserEntryError(ValueError):
    """A ``PIPESTUDIO_USERS`` entry is malformed."""


@dataclass(frozen=True)
class Principal:
    """Who a request acts for: the signed-in person (or the API token) and their role."""

    user: str
    role: Role

    @property
    def may_write(self) -> bool:
        return self.role in WRITERS


@dataclass(frozen=True)
class User:
    name: str
    role: Role
    password_hash: str


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """The ``scrypt$N$r$p$SALT$KEY`` string of ``password``."""
    salt = salt or secrets.token_bytes(16)
    key = hashlib.scrypt(
        password.encode(), salt=salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P, dklen=32
    )
    return "$".join(
        (
            "scrypt",
            str(_SCRYPT_N),
            str(_SCRYPT_R),
            str(_SCRYPT_P),
            base64.b64encode(salt).decode(),
            base64.b64encode(key).decode(),
        )
    )


def check_password(password: str, password_hash: str) -> bool:
    """Whether ``password`` matches ``password_hash`` (compared in constant time)."""
    algorithm, n, r, p, salt, key = password_hash.split("$")
    assert algorithm == "scrypt", "parse_users admits scrypt hashes only"
    expected = base64.b64decode(key)
    found = hashlib.scrypt(
        password.encode()[: 4 * MAX_PASSWORD_CHARS],
        salt=base64.b64decode(salt),
        n=int(n),
        r=int(r),
        p=int(p),
        maxmem=2 * _MAX_SCRYPT_BYTES,
        dklen=len(expected),
    )
    return hmac.compare_digest(found, expected)


def _check_hash(name: str, password_hash: str) -> None:
    parts = password_hash.split("$")
    try:
        n, r, p = (int(v) for v in parts[1:4]) if len(parts) == 6 else (0, 0, 0)
        ok = (
            len(parts) == 6
            and parts[0] == "scrypt"
            and n > 1
            and n & (n - 1) == 0
            and r > 0
            and 0 < p <= 16
            and 128 * r * n <= _MAX_SCRYPT_BYTES
            and len(base64.b64decode(parts[4], validate=True)) >= 8
            and len(base64.b64decode(parts[5], validate=True)) >= 16
        )
    except ValueError:
        ok = False
    if not ok:
        raise UserEntryError(
            f"user {name!r}: the hash must read scrypt$N$r$p$SALT$KEY, as "
            "`pipestudio hash-password` prints it (N a power of two, "
            "128 N r at most 64 MiB)"
        )


def check_name(name: str) -> None:
    """``UserEntryError`` unless ``name`` may sign in: 1-64 letters, digits or _.@-, and
    not the API token's."""
    if not _NAME.match(name):
        raise UserEntryError(
            f"user {name[:64]!r}: a name must be 1-64 letters, digits or "
            "_.@-, and be followed by :ROLE:HASH"
        )
    if name == TOKEN_USER:
        raise UserEntryError(f"user {name!r} is reserved for the API token")


def parse_users(entries: list[str]) -> dict[str, User]:
    """``NAME:ROLE:HASH`` entries by name; ``UserEntryError`` names the first bad one."""
    users: dict[str, User] = {}
    for entry in entries:
        name, _, rest = entry.partition(":")
        role, _, password_hash = rest.partition(":")
        check_name(name)
        if name in users:
            raise UserEntryError(f"user {name!r} is given twice")
        if role not in ROLES:
            raise UserEntryError(
                f"user {name!r}: role {role!r} is unknown; expected one of {', '.join(ROLES)}"
            )
        _check_hash(name, password_hash)
        users[name] = User(name, role, password_hash)  # type: ignore[arg-type]
    return users
