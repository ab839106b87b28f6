"""Values no column can hold are refused at the door: a NUL character (PostgreSQL's text
and JSON refuse it), a lone UTF-16 surrogate (not text at all: it can be stored by SQLite
but never read back as JSON), and NaN or an infinity (not JSON; PostgreSQL's ``json``
refuses them).

``InputGuard`` checks every request's path and query, and the JSON body that an API route
takes, and answers 422 naming the first bad value's place; ``find_unstorable`` does the
same for any decoded JSON value (an uploaded file, a worker's message). It checks only the
bodies ``gate.py`` marks (``ROUTED_BODY``): those a route takes, from someone it serves.
A large one is checked in a worker thread, so the event loop (every other request, every
worker's heartbeat) gets its turns meanwhile. The dashboard's requests pass unread: its
gate asks for a session before its callbacks read anything, and what they store goes
through the API, and so through here.
"""

import json
import math
import re
import sys
from typing import Any
from urllib.parse import parse_qsl

from anyio import to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

Path = tuple[str | int, ...]
#: What a JSON body must contain, as raw bytes, to be able to hold a refused value: a
#: ``\\u`` escape (NUL or a surrogate) or the non-standard NaN and Infinity tokens that
#: Python's parser accepts; or enough brackets to nest deeper than the parser can follow.
#: Bodies without them are not parsed twice.
SUSPECT = ("\\u", "NaN", "Infinity")
_SUSPECT_BYTES = tuple(token.encode() for token in SUSPECT)
_MANY_BRACKETS = 500
#: Digits that may make a number Python's parser cannot take: an exponent of three digits
#: or more (1e999 reads as an infinity), or more digits than an integer may have.
_BIG_NUMBER = re.compile(rb"[eE][+-]?[0-9]{3}|[0-9]{309}")
#: Set in an API request's scope by ``gate.py`` when a route takes its body from someone it
#: serves: only those bodies are checked (module docstring).
ROUTED_BODY = "pipestudio.routed_body"
#: Bodies longer than this are checked in a worker thread (module docstring).
OFF_LOOP_BYTES = 64 * 1024


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored, or None."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which cannot be stored"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"contains a lone surrogate (\\u{ord(text[exc.start]):04x} at character "
            f"{exc.start}), which is not text"
        )
    return None


def find_unstorable(value: Any) -> tuple[Path, str] | None:
    """The place and reason of the first value in ``value`` (decoded JSON) that cannot be
    stored, or None. Walks without recursion (a body may nest deeply) and spells out the
    place only of containers and of the value it refuses: a body of millions of numbers
    costs one pass."""
    stack: list[tuple[Path, Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        if not isinstance(item, dict | list):
            problem = _scalar_problem(item)
            if problem:
                return path, problem
            continue
        for key, child in item.items() if isinstance(item, dict) else enumerate(item):
            problem = text_problem(key) if isinstance(key, str) else None
            if problem:
                return (*path, key), f"the key {problem}"
            if isinstance(child, dict | list):
                stack.append(((*path, key), child))
            else:
                problem = _scalar_problem(child)
                if problem:
                    return (*path, key), problem
    return None


def _scalar_problem(item: Any) -> str | None:
    if isinstance(item, str):
        return text_problem(item)
    if isinstance(item, float) and math.isinf(item):
        return f"is {item} (or a number too large for a float), which is not a JSON number"
    if isinstance(item, float) and math.isnan(item):
        return f"is {item}, which is not a JSON number"
    return None


def shown(part: str | int) -> str | int:
    """A place in a body, fit to be sent back: a key that cannot be stored is spelled
    with escapes (``\\x00``) instead of the character itself."""
    if isinstance(part, str) and text_problem(part):
        return part.encode("unicode_escape", errors="backslashreplace").decode("ascii")
    return part


def refusal(loc: list[str | int], message: str) -> bytes:
    """A 422 body in FastAPI's shape, naming the place (``loc``) and the reason."""
    return json.dumps(
        {"detail": [{"loc": [shown(part) for part in loc], "msg": message, "type": "value_error"}]}
    ).encode()


class InputGuard:
    """ASGI middleware: 422 for a NUL in the path or query, and for an API request's JSON
    body holding a value ``find_unstorable`` refuses (module docstring). Other bodies pass
    untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = self._url_problem(scope)
        if problem is not None:
            await _answer(send, refusal(*problem))
            return
        # the first Content-Type counts, as it does for the routes
        content_type = next((v for k, v in scope["headers"] if k.lower() == b"content-type"), b"")
        if not scope.get(ROUTED_BODY) or b"json" not in content_type.lower():
            await self.app(scope, receive, send)
            return
        messages, body = await _read(receive)
        if len(body) > OFF_LOOP_BYTES:
            problem = await to_thread.run_sync(_body_problem, body)
        else:
            problem = _body_problem(body)
        if problem is not None:
            await _answer(send, refusal(*problem))
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    @staticmethod
    def _url_problem(scope: Scope) -> tuple[list[str | int], str] | None:
        if "\x00" in scope["path"]:
            return ["path"], "the path contains a NUL character (%00)"
        query = scope.get("query_string", b"").decode("latin-1")
        for name, value in parse_qsl(query, keep_blank_values=True, errors="replace"):
            for text in (name, value):
                problem = text_problem(text)
                if problem:
                    return ["query", name], f"{name!r} {problem}"
        return None


def _body_problem(body: bytes) -> tuple[list[str | int], str] | None:
    """Where and why a JSON body cannot be taken, or None (the route's parser then
    answers for JSON that does not parse)."""
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return [
                "body"
            ], f"the body is not UTF-8 text (byte {exc.start} is 0x{body[exc.start]:02x})"
    if (
        not any(token in body for token in _SUSPECT_BYTES)
        and body.count(b"[") + body.count(b"{") <= _MANY_BRACKETS
        and _BIG_NUMBER.search(body) is None
    ):
        return None
    try:
        found = find_unstorable(json.loads(body))
    except RecursionError:
        return ["body"], "the body nests too deeply to be read"
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            limit = sys.get_int_max_str_digits()
            return ["body"], f"the body holds a number of more than {limit} digits"
        return None
    return None if found is None else (["body", *found[0]], found[1])


async def _read(receive: Receive) -> tuple[list[Message], bytes]:
    """Every message of the request body, and the body (``BodyLimit``, outside this
    middleware, has bounded its size)."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        chunks.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body"):
            return messages, b"".join(chunks)


async def _answer(send: Send, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 422,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
