"""OpenAI-style error objects: {"error": {"message", "type", "param", "code"}}.

Client mistakes are `ApiError`s with a 4xx status; the app turns them (and FastAPI's own
HTTP and validation errors) into this shape, so the official client raises its usual
`BadRequestError` / `NotFoundError` / ... with our message.

A body that is not JSON, or not of the documented types, is a 400, as OpenAI and vLLM
answer it (vLLM's RequestValidationError handler turns FastAPI's 422 into a 400), not
FastAPI's 422: `param` is the path of the field at fault (`messages[0].role`), `code`
is OpenAI's `missing_required_parameter`, `invalid_type` or `invalid_json`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

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
RETRY_AFTER_S = 5  # what a 503 tells a client to wait (loading, engine_stalled, draining)


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


# How many of pydantic's errors a validation message lists.
MAX_VALIDATION_ERRORS = 5


def _field_path(loc: Sequence[Any], body: Any, is_missing: bool) -> str:
    """`loc` (pydantic's, after "body") as the request names the field: `messages[0].role`.
    pydantic puts the branch of a union in the location (`prompt`, `list[str]`, 0): a name
    that is not in the body is such a tag and is left out, unless the field is missing."""
    path, node = "", body
    for k, item in enumerate(loc):
        if isinstance(item, int) and isinstance(node, list) and 0 <= item < len(node):
            path, node = f"{path}[{item}]", node[item]
        elif isinstance(item, str) and isinstance(node, dict) and item in node:
            path, node = (f"{path}.{item}" if path else item), node[item]
        elif isinstance(item, str) and is_missing and k == len(loc) - 1:
            path = f"{path}.{item}" if path else item
    return path


def validation_error(errors: Sequence[Mapping[str, Any]], body: Any) -> ApiError:
    """FastAPI's request-validation errors as one 400 naming the first field at fault."""
    if errors and errors[0].get("type") == "json_invalid":  # FastAPI puts the position where a field name would be
        reason = (errors[0].get("ctx") or {}).get("error", "JSON decode error")
        position = errors[0]["loc"][-1]
        return ApiError(400, f"request body is not valid JSON: {reason} at position {position}", None, "invalid_json")
    found: list[tuple[str, str, bool]] = []  # (field path, message, is it missing)
    for err in errors:
        source, *loc = err.get("loc") or ("body",)
        is_missing = err.get("type") == "missing"
        where = _field_path(loc, body if source == "body" else None, is_missing)
        entry = (where, str(err.get("msg")), is_missing)
        if entry not in found:
            found.append(entry)
        if len(found) == MAX_VALIDATION_ERRORS:
            break
    if not found:
        return ApiError(400, "malformed request", None, "invalid_type")
    message = "; ".join(f"{where or 'body'}: {msg}" for where, msg, _ in found)
    where, _, is_missing = found[0]
    return ApiError(400, message, where or None, "missing_required_parameter" if is_missing else "invalid_type")
