"""What the ingest writer checks of a worker's numbered message before it touches the
store, and how non-finite numbers become data.

A message that fails ``screen`` is rejected alone (``ingest.py``): its fields would not fit
their columns (a stage of 10**30, a host of a megabyte), or it names no run; so is one
whose text holds a NUL or a lone surrogate (``cleaned`` finds it). NaN and infinities are
what a diverging run measures, so they are kept: ``cleaned`` turns each into the string
JSON has no number for ("NaN", "Infinity", "-Infinity"), which every database stores and
every client parses. Both walks are skipped for a frame whose raw text holds none of
``inputs.SUSPECT``: without an escape or those tokens there is nothing to find.
"""

import math
from typing import Any

from pipestudio.backend.inputs import text_problem
from pipestudio.backend.protocol import MAX_DB_INT

MESSAGE_TYPES = ("events", "store", "run_state", "command_result")
RANK_STATES = ("running", "finished", "failed", "stopped")
#: Events per message (the agent sends at most 500), and characters of one text field.
MAX_EVENTS = 10_000
MAX_TEXT = 100_000
#: Column widths: an event's kind, a command's name, the store's host.
MAX_KIND, MAX_COMMAND, MAX_HOST = 30, 30, 200
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


class Rejected(ValueError):
    """The message cannot be stored; the text says which field and why."""


def cleaned(value: Any, path: str = "") -> tuple[Any, str | None]:
    """``value`` with every non-finite float replaced by its name (module docstring), and
    the first text in it that cannot be stored (its place and why), in one walk."""
    if isinstance(value, float) and not math.isfinite(value):
        return ("NaN" if math.isnan(value) else _NON_FINITE[value]), None
    if isinstance(value, str):
        problem = text_problem(value)
        return value, (f"{path or 'a text'} {problem}" if problem else None)
    first: str | None = None
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            problem = text_problem(key) if isinstance(key, str) else None
            out[key], found = cleaned(item, where)
            first = first or (f"{where} (the key) {problem}" if problem else found)
        return out, first
    if isinstance(value, list):
        items = []
        for idx, item in enumerate(value):
            clean, found = cleaned(item, f"{path}.{idx}" if path else str(idx))
            items.append(clean)
            first = first or found
        return items, first
    return value, None


def _int(message: dict[str, Any], key: str, low: int, high: int, *, required: bool = False) -> None:
    value = message.get(key)
    if value is None and not required:
        return
    if type(value) is not int or not low <= value <= high:
        raise Rejected(f"{key} must be an integer {low}..{high}, got {str(value)[:40]}")


def _text(message: dict[str, Any], key: str, limit: int) -> None:
    value = message.get(key)
    if value is not None and (not isinstance(value, str) or len(value) > limit):
        raise Rejected(f"{key} must be text of at most {limit} characters")


def _event(idx: int, event: Any) -> None:
    if not isinstance(event, dict):
        raise Rejected(f"events.{idx} is a {type(event).__name__}, not an object")
    kind = event.get("type", "unknown")
    if not isinstance(kind, str) or not 1 <= len(kind) <= MAX_KIND:
        raise Rejected(f"events.{idx}.type must be text of 1..{MAX_KIND} characters")
    for key in ("stage", "replica", "step"):
        value = event.get(key)
        if value is not None and (type(value) is not int or not 0 <= value <= MAX_DB_INT):
            raise Rejected(
                f"events.{idx}.{key} must be an integer 0..{MAX_DB_INT}, got {str(value)[:40]}"
            )
    for key in ("time_ms", "end_ms"):
        value = event.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float, str))
        ):
            raise Rejected(f"events.{idx}.{key} must be a number")
    text = event.get("message")
    if text is not None and (not isinstance(text, str) or len(text) > MAX_TEXT):
        raise Rejected(f"events.{idx}.message must be text of at most {MAX_TEXT} characters")


def screen(message: dict[str, Any]) -> None:
    """Raise ``Rejected`` for a message whose shape the store cannot take (module
    docstring); its text is ``cleaned``'s to check."""
    kind = message.get("type")
    if kind not in MESSAGE_TYPES:
        raise Rejected(f"unknown message type {str(kind)[:40]!r}")
    _int(message, "run_id", 1, MAX_DB_INT, required=True)
    _int(message, "attempt", 0, MAX_DB_INT)
    if kind == "events":
        events = message.get("events")
        if not isinstance(events, list) or len(events) > MAX_EVENTS:
            raise Rejected(f"events must be a list of at most {MAX_EVENTS} events")
        for idx, event in enumerate(events):
            _event(idx, event)
    elif kind == "store":
        _text(message, "host", MAX_HOST)
        _int(message, "port", 1, 65535, required=True)
    elif kind == "run_state":
        if message.get("state") not in RANK_STATES:
            raise Rejected(
                f"state must be one of {', '.join(RANK_STATES)}, got "
                f"{str(message.get('state'))[:40]!r}"
            )
        _text(message, "message", MAX_TEXT)
    else:
        _text(message, "command", MAX_COMMAND)
        _text(message, "message", MAX_TEXT)
        if not isinstance(message.get("payload") or {}, dict):
            raise Rejected("payload must be an object")
