"""The FastAPI app: OpenAI routes, /health, /ready, /metrics, the admin router, errors.

`create_app(client, settings)` wires an `EngineCoreClient` into routes; the engine core
process starts with the app's lifespan (the port is already bound, so /health and /ready
answer while the model loads) and stops with it.

- `/health` is liveness: 200 while the engine core process lives, 503 once it is dead.
- `/ready` is readiness: 200 only when the core has reported ready and has been heard
  from within its stall bound; else 503 with the reason as the error code: `loading`,
  `engine_stalled`, `engine_dead` or `draining`.
- While the engine is loading or stalled, new generation requests get 503 with the same
  code and Retry-After at once, rather than waiting on a core that cannot serve them.
- Draining (`Drain.begin`, on SIGTERM): readiness turns 503 at once, new generation
  requests get 503 with Retry-After, the requests in flight run to their end or until
  the shutdown timeout, when the rest end as aborted (a stream still gets its final
  chunk and [DONE]).
- `/openapi.json` lists every status each route answers with; every error, whether a
  route, FastAPI, the body-limit middleware or an unexpected exception raised it, has
  the OpenAI error shape (`ERROR_SCHEMA`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from ..slo import CLASS_NAME, SloClasses
from .admin import make_admin_router
from .admission import AdmissionConfig
from .api_models import (
    CHAT_ROLES,
    MAX_REPETITION_PENALTY,
    MIN_REPETITION_PENALTY,
    ChatCompletionRequest,
    CompletionRequest,
)
from .core_client import EngineCoreClient, EngineUnavailable, RequestFailed, RequestRejected
from .errors import ApiError, error_response, unparsable_body_message, validation_error
from .metrics import ServerMetrics, cache_config_labels
from .middleware import BodyLimitAndMetrics, RequestIdHeader, response_request_id
from .serving import OpenAIServing
from .slo_metrics import AdmissionCollector
from .token_routes import document_token_schemas, make_tokenize_router
from .tool_parsers import TOOL_PARSERS

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 4 << 20
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
RETRY_AFTER_S = 5  # what a 503 tells a client to wait (loading, engine_stalled, draining)


@dataclass(slots=True)
class ServerSettings:
    served_model_name: str
    admin_token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    enable_fault_injection: bool = False
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    on_shutdown: list[Callable[[], None]] = field(default_factory=list)
    tool_call_parser: str | None = None
    """Tool-call format (tool_parsers.TOOL_PARSERS); None: the one the chat template names."""
    slo_classes: SloClasses = field(default_factory=SloClasses)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    """The deadline margin and the queue caps (admission.py)."""
    """The SLO classes requests choose from (engine/slo.py); none: every request is best effort."""

    def __post_init__(self) -> None:
        if not isinstance(self.served_model_name, str) or not self.served_model_name:
            raise ValueError("served_model_name must be a non-empty string")
        if (
            isinstance(self.max_body_bytes, bool)
            or not isinstance(self.max_body_bytes, int)
            or self.max_body_bytes < 1024
        ):
            raise ValueError(f"max_body_bytes must be an integer >= 1024, got {self.max_body_bytes!r}")
        if (
            isinstance(self.shutdown_timeout_s, bool)
            or not isinstance(self.shutdown_timeout_s, (int, float))
            or self.shutdown_timeout_s < 0
        ):
            raise ValueError(f"shutdown_timeout_s must be a number >= 0, got {self.shutdown_timeout_s!r}")
        if self.admin_token is not None and not self.admin_token.strip():
            raise ValueError("admin_token must not be blank (leave it unset to turn the admin API off)")
        if not isinstance(self.slo_classes, SloClasses):
            raise ValueError(f"slo_classes must be SloClasses, got {type(self.slo_classes).__name__}")
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            raise ValueError(
                f"tool_call_parser must be one of {', '.join(sorted(TOOL_PARSERS))}; got {self.tool_call_parser!r}"
            )


# --- the OpenAPI document -----------------------------------------------------------------

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "code": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            },
        }
    },
}
# The body-limit middleware runs before routing: any request can get it.
COMMON_ERRORS = {413: "the request body is larger than --max-body-bytes"}
GENERATION_ERRORS = {
    400: "the body is not a JSON object of the documented types (param names the field), a value out of range or "
    "not supported (a field this server refuses, api_models.py), a prompt too long for the context, a string with "
    "a lone surrogate, or a body that is not UTF-8 or nests too deeply",
    404: "the model does not exist",
    429: "the request's SLO class cannot meet its TTFT target now (code slo_unattainable; Retry-After)",
    500: "the engine failed while serving the request (code engine_error)",
    503: "the engine is loading, stalled, draining or not running, or the queue is at --max-num-queued-reqs or "
    "--max-num-queued-tokens (code says which; Retry-After unless it is not running)",
}
_NOT_READY = "the engine core is not running (engine_dead); /ready also: loading, engine_stalled or draining"
# Before Open API 3.2 a text/event-stream schema is one event's: data is a chunk's JSON, then [DONE].
_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
_USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        **{k: {"type": "integer"} for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
        "prompt_tokens_details": {
            "type": "object",
            "required": ["cached_tokens"],
            "properties": {"cached_tokens": {"type": "integer", "minimum": 0}},
        },
    },
}


# The values the checks after pydantic's (SamplingParams, the requests' check(), the serving
# layer) accept, written into the request schemas, which from pydantic know only the types;
# unknown fields are ignored. What JSON Schema cannot say stays a 400: min_tokens <= max_tokens,
# best_of = n, stream_options and top_logprobs only with stream / logprobs, the context length,
# token ids past the vocabulary, at most 256 sequences (prompts x n) per request.
_TEXT = {"type": "string", "minLength": 1}
_TOKENS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
_VALUES = {
    "n": {"minimum": 1, "maximum": 64},
    "max_tokens": {"minimum": 1},
    "max_completion_tokens": {"minimum": 1},
    "min_tokens": {"minimum": 0},
    "temperature": {"minimum": 0},
    "top_p": {"exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"minimum": -1},
    "min_p": {"minimum": 0, "maximum": 1},
    "repetition_penalty": {"minimum": MIN_REPETITION_PENALTY, "maximum": MAX_REPETITION_PENALTY},
    "presence_penalty": {"minimum": -2, "maximum": 2},
    "frequency_penalty": {"minimum": -2, "maximum": 2},
    "seed": {"minimum": 0, "maximum": 2**63 - 1},
    "logprobs": {"minimum": 0, "maximum": 20},
    "top_logprobs": {"minimum": 0, "maximum": 20},
    "prompt_logprobs": {"minimum": 0, "maximum": 20},
    "stop_token_ids": {"items": {"type": "integer", "minimum": 0}},
}
_REPLACED: dict[str, dict[str, Any]] = {  # the whole property schema
    "prompt": {
        "anyOf": [
            _TEXT,
            _TOKENS,
            {"type": "array", "minItems": 1, "items": _TEXT},
            {"type": "array", "minItems": 1, "items": _TOKENS},
        ]
    },
    "stop": {"anyOf": [_TEXT, {"type": "array", "items": _TEXT}, {"type": "null"}]},
    "suffix": {"enum": ["", None]},
    "logit_bias": {
        "anyOf": [
            {
                "type": "object",
                "propertyNames": {"pattern": "^[0-9]+$"},
                "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
            },
            {"type": "null"},
        ]
    },
    "tools": {
        "anyOf": [
            {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type", "function"],
                    "properties": {
                        "type": {"const": "function"},
                        "function": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                                "description": {"type": "string"},
                                "parameters": {"type": "object"},
                                "strict": {"type": "boolean"},
                            },
                        },
                    },
                },
            },
            {"type": "null"},
        ]
    },
    "tool_choice": {
        "anyOf": [
            {"enum": ["none", "auto", "required", None]},
            {
                "type": "object",
                "required": ["type", "function"],
                "properties": {
                    "type": {"const": "function"},
                    "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
                },
            },
        ]
    },
    "response_format": {
        "anyOf": [
            {"type": "object", "properties": {"type": {"enum": ["text", "json_object", "json_schema", None]}}},
            {"type": "null"},
        ]
    },
    "messages": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/ChatMessage"}},
    "role": {"enum": list(CHAT_ROLES)},
    "slo_class": {
        "anyOf": [{"type": "string", "pattern": CLASS_NAME.pattern}, {"type": "null"}],
        "description": "an SLO class the server is configured with (--slo-class); wins over the X-SLO-Class "
        "header; unset: the default class",
    },
    "content": {
        "anyOf": [
            {"type": "string"},
            {"type": "null"},
            {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type", "text"],
                    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                },
            },
        ]
    },
}


def _document_request_values(schemas: dict) -> None:
    for name in ("CompletionRequest", "ChatCompletionRequest", "ChatMessage", "StreamOptions"):
        model = schemas[name]
        model["additionalProperties"] = True  # unknown fields are ignored, as vLLM does (api_models.py)
        for prop_name, prop in model["properties"].items():
            if prop_name in _REPLACED:
                model["properties"][prop_name] = {"title": prop.get("title", prop_name), **_REPLACED[prop_name]}
            for branch in prop.get("anyOf", [prop]):  # the non-null branch of `X | None`
                if prop_name in _VALUES and branch.get("type") in ("integer", "number", "array"):
                    branch.update(_VALUES[prop_name])
                    if name == "CompletionRequest" and prop_name == "max_tokens":
                        branch["minimum"] = 0  # 0 only with echo: the prompt's logprobs alone (a 400 otherwise)
    # Rules across fields that JSON Schema can say (the tool-calling checks in serving.py and chat.py).
    schemas["ChatCompletionRequest"]["if"] = {
        "required": ["tool_choice"],
        "properties": {"tool_choice": {"not": {"enum": ["none", None]}}},
    }
    schemas["ChatCompletionRequest"]["then"] = {"required": ["tools"], "properties": {"tools": {"minItems": 1}}}
    schemas["ChatMessage"]["if"] = {"required": ["role"], "properties": {"role": {"const": "tool"}}}
    schemas["ChatMessage"]["then"] = {
        "required": ["tool_call_id"],
        "properties": {"tool_call_id": {"type": "string", "minLength": 1}},
    }


# The header a client that cannot add body fields chooses its SLO class with (serving.py).
SLO_CLASS_PARAMETER = {
    "name": "X-SLO-Class",
    "in": "header",
    "required": False,
    "description": "an SLO class the server is configured with; the body's slo_class wins",
    "schema": {"type": "string", "pattern": CLASS_NAME.pattern},
}


# Every response's header (middleware.py).
REQUEST_ID_RESPONSE_HEADER = {
    "description": "the client's own X-Request-Id when it sent one of 1-128 visible ASCII characters, else the "
    "request's id (a generation's response id)",
    "schema": {"type": "string", "minLength": 1},
}


def _generation_ok(choice: dict) -> dict:
    body = {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "usage": _USAGE,
            "choices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", "finish_reason"],
                    "properties": {"index": {"type": "integer"}, **choice},
                },
            },
        },
    }
    return {
        200: {
            "description": "the completion; with stream true, server-sent events ending in data: [DONE]",
            "content": {"application/json": {"schema": body}, "text/event-stream": {"schema": _SSE_EVENT}},
        },
        **{code: {"description": text} for code, text in GENERATION_ERRORS.items()},
    }


def _json_ok(description: str, schema: dict) -> dict:
    return {200: {"description": description, "content": {"application/json": {"schema": schema}}}}


def _document_errors(doc: dict, error_schema: dict, common: dict[int, str]) -> dict:
    """`doc` with the common errors added to every operation and the error schema on
    every 4xx/5xx response; FastAPI's own validation-error schemas, which this server
    never sends, are dropped, and its automatic 422 is the 400 this server answers."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["Error"] = error_schema
    for operation in (op for item in doc["paths"].values() for op in item.values()):
        responses = operation["responses"]
        fastapi_422 = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema", {})
        if fastapi_422.get("$ref") == "#/components/schemas/HTTPValidationError":
            del responses["422"]  # a path parameter alone (a string) never fails validation
            if "requestBody" in operation or any(p["in"] != "path" for p in operation.get("parameters", [])):
                responses.setdefault("400", {"description": "the request is not of the documented types"})
        for code, text in common.items():
            responses.setdefault(str(code), {"description": text})
        for code, response in responses.items():
            response.setdefault("headers", {})["X-Request-Id"] = REQUEST_ID_RESPONSE_HEADER
            if code[0] in "45":
                response["content"] = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    return doc


class Drain:
    """Graceful shutdown: refuse new work, let what is in flight finish, then stop."""

    def __init__(self, engine: EngineCoreClient, timeout_s: float):
        self.engine = engine
        self.timeout_s = timeout_s
        self.active = False

    def check(self) -> None:
        if self.active:
            raise EngineUnavailable("draining", "the server is shutting down; retry on another replica")

    async def run(self) -> None:
        """Begin draining and return once no request is in flight (or the timeout passed)."""
        self.active = True
        deadline = time.monotonic() + self.timeout_s
        log.info("draining: %d request(s) in flight, up to %.0f s", self.engine.num_live_requests, self.timeout_s)
        while self.engine.num_live_requests and self.engine.is_alive and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        aborted = self.engine.abort_all()
        if aborted:
            log.warning("drain timeout: %d request(s) ended as aborted", aborted)
            await asyncio.sleep(0.2)  # their final chunks go out before the server stops
        log.info("drained")


def create_app(engine: EngineCoreClient, settings: ServerSettings, metrics: ServerMetrics | None = None) -> FastAPI:
    if metrics is None:
        metrics = ServerMetrics(
            settings.served_model_name,
            engine.max_model_len,
            engine.snapshot,
            cache_config_labels(engine.config),
            settings.slo_classes,
        )
        engine.stat_logger = metrics.stats
        engine.slo_logger = metrics.slo
    serving = OpenAIServing(
        engine, settings.served_model_name, settings.tool_call_parser, settings.slo_classes, settings.admission
    )
    metrics.registry.register(AdmissionCollector(serving.admission, settings.slo_classes))
    drain = Drain(engine, settings.shutdown_timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        log.info("serving %s", settings.served_model_name)
        try:
            yield
        finally:
            await engine.shutdown()
            for hook in settings.on_shutdown:
                try:
                    hook()
                except Exception:
                    log.exception("shutdown hook failed")

    app = FastAPI(title="inferd engine", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.admission = serving.admission
    app.state.metrics = metrics
    app.state.settings = settings
    app.state.drain = drain

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return error_response(exc.status, exc.message, exc.param, exc.code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def request_validation_error(request: Request, exc: RequestValidationError):
        err = validation_error(exc.errors(), exc.body)  # a 400, as OpenAI and vLLM answer it
        return error_response(err.status, err.message, err.param, err.code)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        # FastAPI raises these itself, e.g. a 400 for a body it cannot parse (not UTF-8, nested
        # too deep); its {"detail": ...} shape is not one an OpenAI client reads.
        if exc.status_code == 400 and exc.__cause__ is not None:
            return error_response(400, unparsable_body_message(exc.__cause__), None, "invalid_json")
        return error_response(exc.status_code, str(exc.detail), None, None, headers=exc.headers)

    @app.exception_handler(EngineUnavailable)
    async def engine_unavailable(request: Request, exc: EngineUnavailable):
        headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.reason != "engine_dead" else None
        return error_response(503, str(exc), None, exc.reason, headers=headers)

    @app.exception_handler(RequestFailed)
    async def request_failed(request: Request, exc: RequestFailed):
        return error_response(500, str(exc), None, "engine_error")

    @app.exception_handler(RequestRejected)
    async def request_rejected(request: Request, exc: RequestRejected):
        return error_response(400, str(exc), None, "invalid_value")

    @app.exception_handler(404)
    async def not_found(request: Request, exc):
        return error_response(404, f"no route {request.method} {request.url.path}", None, "not_found")

    @app.exception_handler(405)
    async def method_not_allowed(request: Request, exc):
        # Starlette's Allow names the methods of the first route on the path, and GET and PATCH
        # /admin/config are two routes: the document has them all (every path here is static).
        methods = [m.upper() for m in app.openapi()["paths"].get(request.url.path, {})]
        headers = {"Allow": ", ".join(methods)} if methods else getattr(exc, "headers", None)
        return error_response(
            405,
            f"method {request.method} not allowed on {request.url.path}",
            None,
            "method_not_allowed",
            headers=headers,
        )

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception):
        # Starlette still logs the exception; the client gets the error shape, not plain text.
        # It sends this response outside every middleware, RequestIdHeader included.
        headers = {"X-Request-Id": response_request_id(request.scope)}
        return error_response(500, f"internal error: {type(exc).__name__}", None, "internal_error", headers=headers)

    text_choice = {"text": {"type": "string"}, "finish_reason": {"anyOf": [{"type": "string"}, {"type": "null"}]}}
    chat_choice = {
        "message": {"type": "object", "properties": {"role": {"type": "string"}, "content": {"type": "string"}}},
        "finish_reason": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    }

    slo_header = {"parameters": [SLO_CLASS_PARAMETER]}

    @app.post("/v1/completions", responses=_generation_ok(text_choice), openapi_extra=slo_header)
    async def completions(body: CompletionRequest, request: Request):
        drain.check()
        return await serving.completions(body, request)

    @app.post("/v1/chat/completions", responses=_generation_ok(chat_choice), openapi_extra=slo_header)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        drain.check()
        return await serving.chat_completions(body, request)

    model_list = {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "object", "max_model_len"],
                    "properties": {
                        "id": {"type": "string"},
                        "object": {"const": "model"},
                        "max_model_len": {"type": "integer"},
                    },
                },
            },
        },
    }

    @app.get("/v1/models", responses=_json_ok("the served model", model_list))
    async def models():
        return serving.models()

    @app.get(
        "/health",
        response_class=Response,
        responses={
            200: {"description": "the engine core process lives (empty body)", "content": {}},
            503: {"description": _NOT_READY.split(";")[0]},
        },
    )
    async def health():
        if not engine.is_alive:
            return error_response(503, f"the engine core is not running ({engine.state})", None, "engine_dead")
        return Response(status_code=200)

    @app.get(
        "/ready",
        responses={
            **_json_ok(
                "ready to serve",
                {"type": "object", "required": ["status"], "properties": {"status": {"const": "ready"}}},
            ),
            503: {"description": _NOT_READY},
        },
    )
    async def ready():
        state = "draining" if drain.active and engine.is_alive else engine.state
        if state == "ready":
            return {"status": "ready"}
        messages = {
            "loading": "the engine is still loading the model",
            "engine_stalled": engine.stalled_message(),
            "engine_dead": "the engine core is not running",
            "draining": "the server is shutting down",
        }
        headers = {"Retry-After": str(RETRY_AFTER_S)} if state != "engine_dead" else None
        return error_response(503, messages.get(state, state), None, state, headers=headers)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {
                "description": "Prometheus text exposition",
                "content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
            }
        },
    )
    async def prometheus_metrics():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(make_tokenize_router(serving))
    app.include_router(make_admin_router(engine, settings.admin_token, settings.enable_fault_injection))
    app.add_middleware(BodyLimitAndMetrics, max_body_bytes=settings.max_body_bytes, http_metrics=metrics.http)
    app.add_middleware(RequestIdHeader)  # added last: outermost

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                routes=app.routes,
                description="OpenAI-compatible completions, health, metrics and the admin API",
            )
            doc.setdefault("components", {})["securitySchemes"] = {"adminToken": {"type": "http", "scheme": "bearer"}}
            _document_request_values(doc["components"]["schemas"])
            document_token_schemas(doc["components"]["schemas"])
            app.openapi_schema = _document_errors(doc, ERROR_SCHEMA, COMMON_ERRORS)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema
    return app
