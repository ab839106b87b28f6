"""The OpenAPI document, completed with the rule ``InputGuard`` enforces on every request:
no text holds a NUL character. Every string schema without a pattern, format or fixed
values gets a pattern saying so, and every object with free keys a ``propertyNames``
rule, so that a client generating requests from the document (schemathesis) knows it."""

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

#: ECMA-262 (JSON Schema's dialect) and Python alike: any text without U+0000.
NO_NUL = "^[^\\u0000]*$"


def _with_text_rule(node: Any) -> None:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        if item.get("type") == "string" and not {"pattern", "format", "enum", "const"} & set(item):
            item["pattern"] = NO_NUL
        extra = item.get("additionalProperties")
        if item.get("type") == "object" and extra not in (None, False):
            item.setdefault("propertyNames", {}).setdefault("pattern", NO_NUL)
        stack.extend(item.values())


def openapi_builder(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """``app.openapi``: FastAPI's document with the text rule, built once."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            _with_text_rule(document)
            app.openapi_schema = document
        return app.openapi_schema

    return build
