"""The FastAPI app: wiring of the engine core client, the routes, the errors and the drain.

`create_app(client, settings)` sets the app's state (`engine`, `serving`, `admission`,
`metrics`, `settings`, `drain`), which the routes read, and mounts the routers:

- openai_routes.py   /v1/completions, /v1/chat/completions, /v1/models
- probe_routes.py    /health (liveness), /ready (readiness), /metrics
- token_routes.py    /tokenize, /detokenize, /version, /v1/models/{model}
- admin.py           /admin/* behind a bearer token

The engine core process starts with the app's lifespan (the port is already bound, so
/health and /ready answer while the model loads) and stops with it.

- While the engine is loading or stalled, new generation requests get 503 with the same
  code and Retry-After at once, rather than waiting on a core that cannot serve them.
- Draining (`Drain.run`, on SIGTERM; drain.py): readiness turns 503 at once, new
  generation requests get 503 with Retry-After, the requests in flight run to their end
  or until the shutdown timeout.
- `/openapi.json` lists every status each route answers with (openapi_doc.py); every
  error, whether a route, FastAPI, the body-limit middleware or an unexpected exception
  raised it, has the OpenAI error shape (error_handlers.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import FastAPI

from inferd.openapi_doc import serve_document

from ..request.slo import SloClasses
from . import admin, openai_routes, probe_routes, token_routes
from .admission import AdmissionConfig
from .core_client import EngineCoreClient
from .drain import Drain
from .error_handlers import EXCEPTION_HANDLERS
from .metrics import ServerMetrics, cache_config_labels
from .middleware import BodyLimitAndMetrics, RequestIdHeader
from .openapi_doc import DESCRIPTION, finish_document
from .serving import OpenAIServing
from .slo_metrics import AdmissionCollector
from .tool_parsers import TOOL_PARSERS

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 4 << 20
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
__all__ = ["DEFAULT_MAX_BODY_BYTES", "Drain", "ServerSettings", "create_app"]


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
    """The SLO classes requests choose from (engine/request/slo.py); none: every request is best effort."""

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


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    engine: EngineCoreClient = app.state.engine
    settings: ServerSettings = app.state.settings
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

    app = FastAPI(
        title="inferd engine", lifespan=lifespan, docs_url=None, redoc_url=None, exception_handlers=EXCEPTION_HANDLERS
    )
    app.state.engine = engine
    app.state.serving = serving
    app.state.admission = serving.admission
    app.state.metrics = metrics
    app.state.settings = settings
    app.state.drain = Drain(engine, settings.shutdown_timeout_s)
    for module in (openai_routes, probe_routes, token_routes, admin):
        app.include_router(module.router)
    app.add_middleware(BodyLimitAndMetrics, max_body_bytes=settings.max_body_bytes, http_metrics=metrics.http)
    app.add_middleware(RequestIdHeader)  # added last: outermost
    serve_document(app, DESCRIPTION, "adminToken", finish_document)
    return app
