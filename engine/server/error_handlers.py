"""The app's exception handlers: every error, whether a route, FastAPI, the engine core
client or an unexpected exception raised it, answers in the OpenAI error shape (errors.py).

- `EngineUnavailable`: 503 with the reason as the code (`loading`, `engine_stalled`,
  `draining`, `engine_dead`) and Retry-After unless the engine is dead.
- `RequestFailed`: 500 `engine_error`; `RequestRejected`: 400 `invalid_value`.
- FastAPI's validation errors are the 400 OpenAI and vLLM answer, not a 422.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from .core_client import EngineUnavailable, RequestFailed, RequestRejected
from .errors import RETRY_AFTER_S, ApiError, error_response, unparsable_body_message, validation_error
from .middleware import response_request_id


async def api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status, exc.message, exc.param, exc.code, headers=exc.headers)


async def request_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    err = validation_error(exc.errors(), exc.body)  # a 400, as OpenAI and vLLM answer it
    return error_response(err.status, err.message, err.param, err.code)


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    # FastAPI raises these itself, e.g. a 400 for a body it cannot parse (not UTF-8, nested
    # too deep); its {"detail": ...} shape is not one an OpenAI client reads.
    if exc.status_code == 400 and exc.__cause__ is not None:
        return error_response(400, unparsable_body_message(exc.__cause__), None, "invalid_json")
    return error_response(exc.status_code, str(exc.detail), None, None, headers=exc.headers)


async def engine_unavailable(request: Request, exc: EngineUnavailable) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.reason != "engine_dead" else None
    return error_response(503, str(exc), None, exc.reason, headers=headers)


async def request_failed(request: Request, exc: RequestFailed) -> JSONResponse:
    return error_response(500, str(exc), None, "engine_error")


async def request_rejected(request: Request, exc: RequestRejected) -> JSONResponse:
    return error_response(400, str(exc), None, "invalid_value")


async def not_found(request: Request, exc: Exception) -> JSONResponse:
    return error_response(404, f"no route {request.method} {request.url.path}", None, "not_found")


async def method_not_allowed(request: Request, exc: Exception) -> JSONResponse:
    # Starlette's Allow names the methods of the first route on the path, and GET and PATCH
    # /admin/config are two routes: the document has them all (every path here is static).
    methods = [m.upper() for m in request.app.openapi()["paths"].get(request.url.path, {})]
    headers = {"Allow": ", ".join(methods)} if methods else getattr(exc, "headers", None)
    return error_response(
        405,
        f"method {request.method} not allowed on {request.url.path}",
        None,
        "method_not_allowed",
        headers=headers,
    )


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette still logs the exception; the client gets the error shape, not plain text.
    # It sends this response outside every middleware, RequestIdHeader included.
    headers = {"X-Request-Id": response_request_id(request.scope)}
    return error_response(500, f"internal error: {type(exc).__name__}", None, "internal_error", headers=headers)


# FastAPI(exception_handlers=...): an exception class or a status code -> its handler.
EXCEPTION_HANDLERS: dict[Any, Callable[..., Any]] = {
    ApiError: api_error,
    RequestValidationError: request_validation_error,
    HTTPException: http_error,
    EngineUnavailable: engine_unavailable,
    RequestFailed: request_failed,
    RequestRejected: request_rejected,
    404: not_found,
    405: method_not_allowed,
    Exception: unexpected_error,
}
