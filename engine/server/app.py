"""The FastAPI app: OpenAI routes, /health, /metrics, the admin router, error handlers.

`create_app(async_engine, settings)` wires a running-to-be `AsyncEngine` into routes;
the engine thread starts and stops with the app's lifespan.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .admin import make_admin_router
from .api_models import ChatCompletionRequest, CompletionRequest
from .async_engine import AsyncEngine, EngineDeadError, RequestFailed
from .errors import ApiError, error_response
from .metrics import ServerMetrics
from .middleware import BodyLimitAndMetrics
from .serving import OpenAIServing

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 4 << 20


@dataclass(slots=True)
class ServerSettings:
    served_model_name: str
    admin_token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    enable_fault_injection: bool = False
    on_shutdown: list[Callable[[], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.served_model_name, str) or not self.served_model_name:
            raise ValueError("served_model_name must be a non-empty string")
        if isinstance(self.max_body_bytes, bool) or not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be an integer >= 1024, got {self.max_body_bytes!r}")
        if self.admin_token is not None and not self.admin_token.strip():
            raise ValueError("admin_token must not be blank (leave it unset to turn the admin API off)")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, first = [], None
    for err in exc.errors()[:5]:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        where = ".".join(loc) or "body"
        first = first or (loc[0] if loc else None)
        parts.append(f"{where}: {err.get('msg')}")
    return "; ".join(parts) or "malformed request", first


def create_app(engine: AsyncEngine, settings: ServerSettings, metrics: ServerMetrics | None = None) -> FastAPI:
    if metrics is None:
        metrics = ServerMetrics(settings.served_model_name, engine.engine.max_model_len, engine.snapshot)
        engine.stat_logger = metrics.stats
    serving = OpenAIServing(engine, settings.served_model_name)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        log.info("serving %s", settings.served_model_name)
        try:
            yield
        finally:
            engine.shutdown()
            for hook in settings.on_shutdown:
                try:
                    hook()
                except Exception:
                    log.exception("shutdown hook failed")

    app = FastAPI(title="inferd engine", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.settings = settings

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return error_response(exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return error_response(422, message, param, "invalid_request_shape")

    @app.exception_handler(EngineDeadError)
    async def engine_dead(request: Request, exc: EngineDeadError):
        return error_response(503, str(exc), None, "engine_unavailable")

    @app.exception_handler(RequestFailed)
    async def request_failed(request: Request, exc: RequestFailed):
        return error_response(500, str(exc), None, "engine_error")

    @app.exception_handler(404)
    async def not_found(request: Request, exc):
        return error_response(404, f"no route {request.method} {request.url.path}", None, "not_found")

    @app.exception_handler(405)
    async def method_not_allowed(request: Request, exc):
        return error_response(405, f"method {request.method} not allowed on {request.url.path}", None,
                              "method_not_allowed")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await serving.completions(body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await serving.chat_completions(body, request)

    @app.get("/v1/models")
    async def models():
        return serving.models()

    @app.get("/health")
    async def health():
        if not engine.is_alive:
            return error_response(503, f"engine thread is not running ({engine.fatal_error or 'stopped'})",
                                  None, "engine_unavailable")
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(make_admin_router(engine, settings.admin_token, settings.enable_fault_injection))
    app.add_middleware(BodyLimitAndMetrics, max_body_bytes=settings.max_body_bytes, http_metrics=metrics.http)
    return app
