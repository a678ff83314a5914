"""Admin API: read and change the engine's tunables while it serves.

    GET   /admin/config          {"config": {tunable: value}, "bounds": {...}}
    PATCH /admin/config {k: v}   applied between steps, all or nothing; 422 naming the
                                 bound when a value is outside it; returns the applied config
    POST  /admin/mode {"mode"}   fast or fallback
    POST  /admin/fault {"kind": "fastpath"} or {"kind": "slow_swap", "seconds_per_block": s}
                                 only with --enable-fault-injection

Every call needs `Authorization: Bearer <token>` (the scheme in any case, RFC 7235),
the token compared in constant time; a 401 says `WWW-Authenticate: Bearer`. With no
token configured the admin API is off (403 saying so). The request bodies are parsed
here, not by FastAPI; their schemas (`openapi_extra`) are what these handlers accept.
The handlers read the app's `engine` and `settings` (app.py sets them on its state).
"""

from __future__ import annotations

import hmac
import logging
import os
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from ..config import TUNABLE_BOUNDS, validate_changes
from .core_client import EngineCoreClient
from .errors import ApiError, unparsable_body_message

log = logging.getLogger(__name__)

TOKEN_ENV = "INFERD_ADMIN_TOKEN"
# fastpath: the next fast-path step fails; slow_swap: every swapped KV block costs
# seconds_per_block more (0 turns it off)
FAULT_KINDS = ("fastpath", "slow_swap")


def load_admin_token(path: str | os.PathLike | None = None, env: dict | None = None) -> str | None:
    """The token from --admin-token-file when given, else INFERD_ADMIN_TOKEN, else None (admin off)."""
    if path:
        text = Path(path).read_text().strip()
        if not text:
            raise ValueError(f"admin token file {path} is empty")
        return text
    return (env if env is not None else os.environ).get(TOKEN_ENV) or None


def _tunable_schema(bounds: tuple) -> dict:
    if isinstance(bounds[0], str):
        return {"type": "string", "enum": list(bounds)}
    return {"type": "integer", "minimum": bounds[0], "maximum": bounds[1]}


def _json_body(schema: dict) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


CONFIG_SCHEMA = {
    "type": "object",
    "required": ["config", "bounds", "path", "path_reason"],
    "properties": {
        "config": {"type": "object", "properties": {name: _tunable_schema(b) for name, b in TUNABLE_BOUNDS.items()}},
        "bounds": {"type": "object"},
        "path": {"type": "string", "enum": ["fast", "portable"]},
        "path_reason": {"type": ["string", "null"]},
    },
}
CHANGES_SCHEMA = {
    "type": "object",
    "minProperties": 1,
    "additionalProperties": False,
    "properties": {name: _tunable_schema(b) for name, b in TUNABLE_BOUNDS.items()},
}
MODE_SCHEMA = {
    "type": "object",
    "required": ["mode"],
    "additionalProperties": False,
    "properties": {"mode": _tunable_schema(TUNABLE_BOUNDS["mode"])},
}
FAULT_SCHEMA = {
    "oneOf": [
        {"type": "object", "required": ["kind"], "properties": {"kind": {"const": "fastpath"}}},
        {
            "type": "object",
            "required": ["kind", "seconds_per_block"],
            "properties": {
                "kind": {"const": "slow_swap"},
                "seconds_per_block": {"type": "number", "minimum": 0, "maximum": 1},
            },
        },
    ]
}
_Responses = dict[int | str, dict[str, Any]]  # FastAPI's `responses=`: status -> OpenAPI response
# Every admin route: the token, and an engine core that is up. The body routes add 422.
_ADMIN_ERRORS: _Responses = {
    401: {
        "description": "the Authorization header is missing, not Bearer, or has the wrong token",
        "headers": {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    },
    403: {"description": "the admin API is off: no admin token is configured"},
    500: {"description": "the engine core failed to carry out the call"},
    503: {"description": "the engine core is loading, stalled or not running"},
}
_INVALID_BODY: _Responses = {
    422: {"description": "the body is not a JSON object, or a value is outside its bound (param names it)"}
}
_CONFIG_OK: _Responses = {
    200: {
        "description": "the tunables in force and their bounds",
        "content": {"application/json": {"schema": CONFIG_SCHEMA}},
    }
}
_SECURED: dict[str, Any] = {"security": [{"adminToken": []}]}


def _bounds() -> dict[str, Any]:
    return {
        name: (list(b) if isinstance(b[0], str) else {"min": b[0], "max": b[1]}) for name, b in TUNABLE_BOUNDS.items()
    }


async def _json_object(request: Request) -> dict:
    try:
        body = await request.json()
    except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8 (ValueErrors), or nested too deep
        raise ApiError(422, unparsable_body_message(exc), None, "invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(422, f"request body must be a JSON object, got {type(body).__name__}", None, "invalid_json")
    # JSON has one number type: 64.0 is the integer 64 (JSON Schema's integer includes it).
    return {k: int(v) if isinstance(v, float) and v.is_integer() and abs(v) <= 2**53 else v for k, v in body.items()}


router = APIRouter(prefix="/admin")


def authorize(request: Request) -> None:
    """Refuse the call unless it carries the admin token (the app's settings.admin_token)."""
    token = request.app.state.settings.admin_token
    if not token:
        raise ApiError(
            403,
            "the admin API is off: no admin token is configured (set INFERD_ADMIN_TOKEN "
            "or start with --admin-token-file)",
            None,
            "admin_disabled",
        )
    header = request.headers.get("authorization", "")
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise ApiError(
            401,
            "missing or wrong admin token (Authorization: Bearer <token>)",
            None,
            "invalid_token",
            headers={"WWW-Authenticate": "Bearer"},  # RFC 7235: a 401 names the scheme it wants
        )


def config_body(engine: EngineCoreClient, tunables: dict[str, Any]) -> dict:
    # `mode` is what was asked for; `path` is what runs: without an accelerated kernel
    # (on CPU, say) the portable path runs in either mode, and path_reason says why.
    unavailable = engine.fast_path_unavailable
    reason: str | None
    if tunables.get("mode") == "fallback":
        path, reason = "portable", "mode is fallback"
    else:
        path, reason = ("portable", f"fast path unavailable: {unavailable}") if unavailable else ("fast", None)
    return {"config": tunables, "bounds": _bounds(), "path": path, "path_reason": reason}


@router.get("/config", responses={**_CONFIG_OK, **_ADMIN_ERRORS}, openapi_extra=_SECURED)
async def get_config(request: Request):
    authorize(request)
    engine: EngineCoreClient = request.app.state.engine
    return config_body(engine, await engine.get_tunables())


@router.patch(
    "/config",
    responses={**_CONFIG_OK, **_ADMIN_ERRORS, **_INVALID_BODY},
    openapi_extra={**_SECURED, **_json_body(CHANGES_SCHEMA)},
)
async def patch_config(request: Request):
    authorize(request)
    engine: EngineCoreClient = request.app.state.engine
    changes = await _json_object(request)
    if not changes:
        raise ApiError(422, "no changes given: send a JSON object of tunable -> value", None, "invalid_value")
    try:
        # Here first, so that what the channel to the core cannot carry (an integer past
        # 64 bits, a lone surrogate) is a 422 too; the core checks the rules across fields.
        validate_changes(changes)
        config = await engine.reconfigure(changes)
    except ValueError as exc:
        raise ApiError(422, str(exc), getattr(exc, "name", None) or next(iter(changes)), "invalid_value") from None
    log.info("admin: applied %s", changes)
    return config_body(engine, config)


@router.post(
    "/mode",
    responses={**_CONFIG_OK, **_ADMIN_ERRORS, **_INVALID_BODY},
    openapi_extra={**_SECURED, **_json_body(MODE_SCHEMA)},
)
async def set_mode(request: Request):
    authorize(request)
    engine: EngineCoreClient = request.app.state.engine
    body = await _json_object(request)
    if set(body) != {"mode"}:
        raise ApiError(
            422, f'body must be {{"mode": "fast" | "fallback"}}, got keys {sorted(body)}', "mode", "invalid_value"
        )
    try:
        validate_changes({"mode": body["mode"]})
        config = await engine.set_mode(body["mode"])
    except ValueError as exc:
        raise ApiError(422, str(exc), "mode", "invalid_value") from None
    log.info("admin: mode set to %s", config["mode"])
    return config_body(engine, config)


_FAULT_OK = {"type": "object", "required": ["injected"], "properties": {"injected": {"type": "string"}}}


@router.post(
    "/fault",
    responses={
        200: {
            "description": "the fault was injected (a fast-path failure, or slow KV swaps)",
            "content": {"application/json": {"schema": _FAULT_OK}},
        },
        **_ADMIN_ERRORS,
        **_INVALID_BODY,
        404: {"description": "fault injection is off (--enable-fault-injection)"},
    },
    openapi_extra={**_SECURED, **_json_body(FAULT_SCHEMA)},
)
async def inject_fault(request: Request):
    authorize(request)
    engine: EngineCoreClient = request.app.state.engine
    if not request.app.state.settings.enable_fault_injection:
        raise ApiError(
            404,
            "fault injection is off (start the server with --enable-fault-injection)",
            None,
            "fault_injection_disabled",
        )
    body = await _json_object(request)
    kind = body.get("kind")
    if kind not in FAULT_KINDS:
        raise ApiError(422, f"kind must be one of {', '.join(FAULT_KINDS)}; got {kind!r}", "kind", "invalid_value")
    if kind == "slow_swap":
        seconds = body.get("seconds_per_block")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= 1:
            raise ApiError(
                422,
                f"seconds_per_block must be a number in [0, 1]; got {seconds!r}",
                "seconds_per_block",
                "invalid_value",
            )
        await engine.inject_slow_swap(float(seconds))
        log.warning("admin: every swapped KV block now costs %g s more", seconds)
        return {"injected": kind}
    await engine.inject_fastpath_failure("admin_fault")
    log.warning("admin: injected a fast-path failure")
    return {"injected": kind}
