"""OpenAI-style error objects: {"error": {"message", "type", "param", "code"}}.

Client mistakes are `ApiError`s with a 4xx status; the app turns them (and FastAPI's own
HTTP and validation errors) into this shape, so the official client raises its usual
`BadRequestError` / `NotFoundError` / ... with our message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from fastapi.responses import JSONResponse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "internal_server_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def printable(text: str | None) -> str | None:
    """`text` with lone surrogates written as escapes: a message or param that quotes
    client text must still encode as UTF-8, or rendering the error fails with a 500."""
    if text is None:
        return None
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {
        "error": {
            "message": printable(message),
            "type": ERROR_TYPES.get(status, "invalid_request_error"),
            "param": printable(param),
            "code": printable(code),
        }
    }


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param, code)


def unparsable_body_message(exc: BaseException | None) -> str:
    """Why a request body could not be parsed as JSON, in words a client can act on."""
    if isinstance(exc, UnicodeDecodeError):
        return f"request body is not valid UTF-8: byte 0x{exc.object[exc.start]:02x} at position {exc.start}"
    if isinstance(exc, RecursionError):
        return "request body is not valid JSON: it nests too deeply to parse"
    if isinstance(exc, json.JSONDecodeError):
        return f"request body is not valid JSON: {exc.msg} at position {exc.pos}"
    return f"request body is not valid JSON: {exc}" if exc is not None else "request body is not valid JSON"
