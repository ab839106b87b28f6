"""Shapes every resource shares: errors, ids, and requests that give one of several
sources (a discriminated union, so that the OpenAPI document states the real choice)."""

from collections.abc import Callable
from typing import Annotated, Any, Union

from fastapi import Path, Query
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from pipestudio.backend.protocol import MAX_DB_INT
from pipestudio.planner.formats.documents import Integral


class ErrorPublic(BaseModel):
    """A 401, 403, 404, 409 or 413 answer: what went wrong, in words."""

    detail: str


class FieldError(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ValidationErrorPublic(BaseModel):
    """A 422 answer: one entry per bad field, naming it (``loc``) and why (``msg``)."""

    detail: list[FieldError]


class Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class Request(BaseModel):
    """A request body: exactly the fields it declares, of exactly their types (no "3"
    for 3, no 0 for false), as the OpenAPI document states them."""

    model_config = ConfigDict(extra="forbid", strict=True)


MAX_ID = MAX_DB_INT
#: The id of a stored item, in a body (``DbId``) or a path (``PathId``).
DbId = Annotated[int, Field(ge=1, le=MAX_ID), Integral]
PathId = Annotated[int, Path(ge=1, le=MAX_ID)]
QueryId = Annotated[int, Query(ge=1, le=MAX_ID)]

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {
        "model": ErrorPublic,
        "description": "The body cannot be parsed at all (a malformed multipart form).",
    },
    401: {
        "model": ErrorPublic,
        "description": "Missing or wrong credential (API token or session token).",
    },
    403: {"model": ErrorPublic, "description": "The credential may read but not change."},
    404: {"model": ErrorPublic, "description": "No such item."},
    409: {"model": ErrorPublic, "description": "Conflicts with the stored state."},
    413: {"model": ErrorPublic, "description": "The body is larger than the upload limit."},
}


#: Marks a union's tag in an error's ``loc``, which ``errors.py`` leaves out: the client
#: sent ``{"manual": {...}}``, not ``{"manual": {"manual": ...}}``.
TAG_PREFIX = "source:"


def choice(*names: str, default: str | None = None) -> Callable[[Any], str | None]:
    """A discriminator for a request that gives exactly one of ``names`` (or, with
    ``default``, a request whose ``format`` names one): the tag of the one given."""

    def found(value: Any) -> str | None:
        if isinstance(value, BaseModel):  # a model already: its own kind
            kind = getattr(value, "format" if default is not None else "source_kind", None)
            return kind if isinstance(kind, str) else None
        if not isinstance(value, dict):
            return None
        if default is not None:
            kind = value.get("format", default)
            return kind if kind in names else None
        given = [name for name in names if value.get(name) is not None]
        return given[0] if len(given) == 1 else None

    def tag(value: Any) -> str | None:
        kind = found(value)
        return None if kind is None else TAG_PREFIX + kind

    return tag


def one_of(
    *variants: tuple[type[BaseModel], str], tag: Callable[[Any], str | None], what: str
) -> Any:
    """The union of ``variants`` chosen by ``tag``; the error names what to give."""
    tagged = tuple(Annotated[model, Tag(TAG_PREFIX + name)] for model, name in variants)
    union = Union[tagged]  # type: ignore[valid-type]  # noqa: UP007 (built at run time)
    return Annotated[
        union, Discriminator(tag, custom_error_type="source", custom_error_message=what)
    ]
