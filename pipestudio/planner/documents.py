"""Shared machinery of the versioned JSON documents: loading, saving, readable errors."""

import json
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipestudio.planner.errors import PlannerError

Milliseconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Bytes = Annotated[int, Field(ge=0)]


class DocumentError(PlannerError):
    """A document failed validation; the message lists every bad field by its path."""


class Document(BaseModel):
    """Base of Profile, Cluster, Plan and SimResult: strict fields, JSON in and out."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    def to_json(self, indent: int | None = 2) -> str:
        return self.model_dump_json(indent=indent, exclude_none=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")


DocT = TypeVar("DocT", bound=Document)


def parse_document(model: type[DocT], data: Any, *, source: str = "document") -> DocT:
    """Validate ``data`` (a dict or a JSON string) as ``model``, with a readable error."""
    try:
        if isinstance(data, (str, bytes)):
            return model.model_validate_json(data)
        return model.model_validate(data)
    except ValidationError as exc:
        raw = _as_python(data)
        raise DocumentError(describe_validation_error(exc, raw, source=source)) from None


def load_document(model: type[DocT], path: str | Path) -> DocT:
    """Read and validate a JSON document file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror}") from None
    return parse_document(model, text, source=str(path))


def describe_validation_error(exc: ValidationError, raw: Any, *, source: str) -> str:
    """One line per problem: the field's path (with layer names where known) and why."""
    lines = [f"{source} is not a valid {exc.title}:"]
    for error in exc.errors(include_url=False):
        where = _describe_path(error["loc"], raw)
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] in ("missing", "extra_forbidden") or not error["loc"]:
            lines.append(f"  {where}: {message}" if where else f"  {message}")
        else:
            lines.append(f"  {where} = {error.get('input')!r}: {message}")
    return "\n".join(lines)


def _describe_path(loc: tuple[int | str, ...], raw: Any) -> str:
    parts: list[str] = []
    node = raw
    for key in loc:
        if isinstance(key, int):
            label = f"[{key}]"
            item = node[key] if isinstance(node, list) and key < len(node) else None
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                label += f" ({item['name']!r})"
            parts.append(label)
            node = item
        else:
            parts.append(f".{key}" if parts else str(key))
            node = node.get(key) if isinstance(node, dict) else None
    return "".join(parts)


def _as_python(data: Any) -> Any:
    if isinstance(data, (str, bytes)):
        try:
            return json.loads(data)
        except ValueError:
            return None
    return data
