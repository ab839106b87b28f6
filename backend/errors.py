"""The API's errors and how each becomes an HTTP answer: 404, 409, 413 or 422, never 500
for bad input. A planner's ``ValueError`` is a mistake in the input and answers 422.

Two requests on one item at once (an edit racing a delete) meet in the database: the loser
finds its row changed or gone (``StaleDataError``) or a reference gone
(``IntegrityError``), and answers 409 to be retried on what is stored now."""

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm.exc import StaleDataError

from pipestudio.backend.schemas.common import TAG_PREFIX


class NotFoundError(LookupError):
    """No item of this kind has this id."""

    def __init__(self, kind: str, item_id: object) -> None:
        super().__init__(f"{kind} {item_id} does not exist")


class ConflictError(RuntimeError):
    """The request contradicts what is stored (deleting a profile a plan uses...)."""


class InputError(ValueError):
    """A field's value is refused; ``field`` is its path in the request body."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _location(exc: ValueError) -> list[str | int]:
    if isinstance(exc, InputError):
        parts = [int(p) if p.isdigit() else p for p in exc.field.split(".") if p]
        return parts if parts and parts[0] in ("query", "path") else ["body", *parts]
    return ["body"]


def add_error_handlers(app: FastAPI) -> None:
    async def not_found(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    async def conflict(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    async def bad_value(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ValueError)
        return JSONResponse(
            {"detail": [{"loc": _location(exc), "msg": str(exc), "type": "value_error"}]},
            status_code=422,
        )

    async def raced(_request: Request, _exc: Exception) -> JSONResponse:
        return JSONResponse(
            {
                "detail": "another request changed or deleted this item at the "
                "same time; read it again and retry"
            },
            status_code=409,
        )

    async def unfit(_request: Request, exc: Exception) -> JSONResponse:
        reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]
        return JSONResponse(
            {
                "detail": [
                    {
                        "loc": ["body"],
                        "msg": f"a value does not fit the store: {reason}",
                        "type": "value_error",
                    }
                ]
            },
            status_code=422,
        )

    async def too_deep(_request: Request, _exc: Exception) -> JSONResponse:
        return JSONResponse(
            {
                "detail": [
                    {
                        "loc": ["body"],
                        "msg": "the body nests too deeply to be read",
                        "type": "value_error",
                    }
                ]
            },
            status_code=422,
        )

    async def invalid(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = [
            {
                **error,
                "loc": [
                    part
                    for part in error["loc"]
                    if not (isinstance(part, str) and part.startswith(TAG_PREFIX))
                ],
            }
            for error in exc.errors()
        ]
        return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(NotFoundError, not_found)
    app.add_exception_handler(ConflictError, conflict)
    app.add_exception_handler(ValueError, bad_value)
    app.add_exception_handler(StaleDataError, raced)
    app.add_exception_handler(IntegrityError, raced)
    app.add_exception_handler(DataError, unfit)
    app.add_exception_handler(RecursionError, too_deep)
