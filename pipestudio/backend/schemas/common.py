"""Shapes every resource shares: errors and pages."""

from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import BaseModel, ConfigDict, Field


class ErrorPublic(BaseModel):
    """A 401, 404, 409 or 413 answer: what went wrong, in words."""

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


MAX_ID = 2**31 - 1
#: The id of a stored item, in a body (``DbId``) or a path (``PathId``).
DbId = Annotated[int, Field(ge=1, le=MAX_ID)]
PathId = Annotated[int, Path(ge=1, le=MAX_ID)]
QueryId = Annotated[int, Query(ge=1, le=MAX_ID)]

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorPublic, "description": "Missing or wrong API token."},
    404: {"model": ErrorPublic, "description": "No such item."},
    409: {"model": ErrorPublic, "description": "Conflicts with the stored state."},
    413: {"model": ErrorPublic, "description": "The body is larger than the upload limit."},
}
