"""The agent's HTTP app (port 10400): /metrics, /healthz, /v1/topology.

/metrics is the agent's CollectorSet rendered by exporters.exposition (the same bytes
client_python's generate_latest writes, in a third of the time), followed by
client_python's default process_*, python_gc_* and python_info families, which
exporters conventionally carry (node_exporter and dcgm-exporter have Go's process_*).

Hooks for other agent modules: `AgentState` is the narrow object the routes read, and
`create_app(state, routers)` mounts extra FastAPI routers. `agent.main` mounts the
router of `agent.webhook` when that module exists: it must define
`make_router(state: AgentState) -> fastapi.APIRouter` and serves `/v1/alerts`
(Alertmanager webhook) and `/v1/actions` from it; state.engine_metrics and
state.supervisor give it the engine's readings and process.

Every error the app sends, from a route, from FastAPI (an unknown path, a wrong method,
a bad query parameter) or from an unexpected exception, is `{"error": "<message>"}`
(`ERROR_SCHEMA`); `/openapi.json` lists each route's statuses with that shape.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR

from inferd.agent.supervisor import Supervisor
from inferd.exporters.engine_metrics import EngineMetricsReader
from inferd.exporters.exposition import render_exposition
from inferd.exporters.registry import CollectorSet

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
_TEXT = {"schema": {"type": "string"}}


@dataclass(slots=True)
class AgentState:
    collectors: CollectorSet
    topology: dict[str, Any] | None = None  # agent.topology.Topology.to_dict() when discovered
    topology_error: str | None = None
    placement: dict[str, Any] = field(default_factory=dict)  # chosen node, cpus, binding
    supervisor: Supervisor | None = None
    engine_metrics: EngineMetricsReader | None = None
    engine_url: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # room for other modules' state

    @classmethod
    def with_collectors(cls, collectors: CollectorSet | Iterable, **kwargs) -> AgentState:
        collector_set = collectors if isinstance(collectors, CollectorSet) else CollectorSet(collectors)
        return cls(collectors=collector_set, **kwargs)

    def render_metrics(self) -> bytes:
        """The /metrics body: every collector's families in the text format (exporters.exposition)."""
        defaults = (c.collect() for c in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR))
        return render_exposition(itertools.chain(self.collectors.collect(), *defaults))

    def health(self) -> dict[str, Any]:
        supervisor = self.supervisor
        engine = None
        if supervisor is not None:
            engine = {
                "up": supervisor.is_up,
                "pid": supervisor.pid,
                "readiness": supervisor.readiness,
                "restarts": supervisor.restarts,
                "crash_loop": supervisor.crash_looping,
                "error": supervisor.error or supervisor.port_conflict,
                "orphan_stopped": supervisor.orphan_stopped,
                "binding": supervisor.binding,
                "url": self.engine_url,
            }
        # The agent's own liveness: it serves whatever its engine does, so an engine that is
        # down only makes it "degraded" (the body says why), never a failing probe.
        healthy = supervisor is None or supervisor.is_ready
        return {"status": "ok" if healthy else "degraded", "engine": engine, "collectors": self.collectors.names}


def create_app(state: AgentState, routers: Iterable[Any] = ()):
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.openapi.utils import get_openapi
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException

    app = FastAPI(title="inferd agent", docs_url=None, redoc_url=None)
    app.state.agent = state

    def error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        messages = {
            404: f"no route {request.method} {request.url.path}",
            405: f"method {request.method} not allowed on {request.url.path}",
        }
        return error(exc.status_code, messages.get(exc.status_code, str(exc.detail)), exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        parts = [
            f"{'.'.join(str(x) for x in e.get('loc', ())[1:]) or 'request'}: {e.get('msg')}" for e in exc.errors()[:5]
        ]
        return error(422, "; ".join(parts) or "malformed request")

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception):
        return error(500, f"internal error: {type(exc).__name__}")  # Starlette still logs the traceback

    @app.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {"description": "Prometheus text exposition", "content": {CONTENT_TYPE_LATEST.split(";")[0]: _TEXT}}
        },
    )
    def metrics():
        return Response(state.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    health = {
        "type": "object",
        "required": ["status", "engine", "collectors"],
        "properties": {
            "status": {"enum": ["ok", "degraded"]},
            "engine": {"anyOf": [{"type": "object"}, {"type": "null"}]},
            "collectors": {"type": "array", "items": {"type": "string"}},
        },
    }

    @app.get(
        "/healthz",
        responses={
            200: {
                "description": "the agent's liveness; degraded while its engine is not ready",
                "content": {"application/json": {"schema": health}},
            }
        },
    )
    def healthz():
        return JSONResponse(state.health())

    @app.get(
        "/v1/topology",
        responses={
            200: {
                "description": "the discovered topology and the engine's placement",
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["topology", "placement"],
                            "properties": {"topology": {"type": "object"}, "placement": {"type": "object"}},
                        }
                    }
                },
            },
            503: {"description": "the topology could not be discovered (error says why)"},
        },
    )
    def topology():
        if state.topology is None:
            return error(503, state.topology_error or "topology not discovered")
        return JSONResponse({"topology": state.topology, "placement": state.placement})

    for router in routers:
        app.include_router(router)

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                routes=app.routes,
                description="The node agent: metrics, health, topology, Alertmanager webhook, actions",
            )
            doc.setdefault("components", {})["securitySchemes"] = {"webhookToken": {"type": "http", "scheme": "bearer"}}
            app.openapi_schema = document_errors(doc, ERROR_SCHEMA)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to customise the schema
    return app


def document_errors(doc: dict, error_schema: dict) -> dict:
    """`doc` with the error schema on every 4xx/5xx response; FastAPI's own
    validation-error schemas, which this app never sends, are dropped."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["Error"] = error_schema
    for operation in (op for item in doc["paths"].values() for op in item.values()):
        for code, response in operation["responses"].items():
            if code[0] in "45":
                response["content"] = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    return doc


def load_extra_routers(
    state: AgentState, modules: Iterable[str] = ("inferd.agent.webhook",), log: Callable[[str], None] = print
):
    """Routers from optional agent modules that define make_router(state).

    OSError and ValueError (bad configuration the user must fix) propagate; any other
    failure is logged and the module left out, so the agent keeps serving /metrics."""
    import importlib

    routers = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # not built yet
            raise
        make_router = getattr(module, "make_router", None)
        if make_router is None:
            log(f"{name} has no make_router(state); its routes are not mounted")
            continue
        try:
            routers.append(make_router(state))
        except (OSError, ValueError):
            raise
        except Exception as exc:
            log(f"{name}.make_router failed, its routes are not mounted: {type(exc).__name__}: {exc}")
    return routers
