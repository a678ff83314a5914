"""The OpenAPI document as both FastAPI apps (the engine server and the agent) publish it.

FastAPI derives the document from the routes; each app then names its bearer-token
security scheme and documents its errors in its own shape (the engine's OpenAI error, the
agent's `{"error"}`) on every 4xx and 5xx response. FastAPI's validation-error schemas are
dropped: neither app ever sends them. The document is built once, at the first request
for it, when every router is mounted.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi


def operations(doc: dict) -> Iterator[dict[str, Any]]:
    """Every operation of every path in `doc`."""
    return (op for item in doc["paths"].values() for op in item.values())


def json_ok(description: str, schema: dict) -> dict[int | str, dict[str, Any]]:
    """A route's `responses=` entry for a 200 with a JSON body of `schema`."""
    return {200: {"description": description, "content": {"application/json": {"schema": schema}}}}


def document_errors(
    doc: dict, error_schema: dict, each_operation: Callable[[dict[str, Any]], None] | None = None
) -> dict:
    """`doc` with `error_schema` on every 4xx/5xx response; `each_operation` first adds what
    an app documents of every operation (common errors, headers)."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["Error"] = error_schema
    for operation in operations(doc):
        if each_operation is not None:
            each_operation(operation)
        for code, response in operation["responses"].items():
            if code[0] in "45":
                response["content"] = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    return doc


def serve_document(app: FastAPI, description: str, bearer_scheme: str, finish: Callable[[dict], dict]) -> None:
    """Have `app` publish FastAPI's document of its routes with `description`, the bearer
    security scheme `bearer_scheme` and what `finish` writes into it."""
    # FastAPI's documented way to extend the schema is to replace app.openapi.
    app.openapi = functools.partial(_document_once, app, description, bearer_scheme, finish)  # type: ignore[method-assign]


def _document_once(app: FastAPI, description: str, bearer_scheme: str, finish: Callable[[dict], dict]) -> dict:
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes, description=description)
        doc.setdefault("components", {})["securitySchemes"] = {bearer_scheme: {"type": "http", "scheme": "bearer"}}
        app.openapi_schema = finish(doc)
    return app.openapi_schema
