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

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR
from starlette.exceptions import HTTPException

from inferd.agent.supervisor import Supervisor
from inferd.exporters.engine_metrics import EngineMetricsReader
from inferd.exporters.exposition import render_exposition
from inferd.exporters.registry import CollectorSet
from inferd.openapi_doc import document_errors, json_ok, serve_document

DESCRIPTION = "The node agent: metrics, health, topology, Alertmanager webhook, actions"
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


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    messages = {
        404: f"no route {request.method} {request.url.path}",
        405: f"method {request.method} not allowed on {request.url.path}",
    }
    return _error(exc.status_code, messages.get(exc.status_code, str(exc.detail)), exc.headers)


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    parts = [f"{'.'.join(str(x) for x in e.get('loc', ())[1:]) or 'request'}: {e.get('msg')}" for e in exc.errors()[:5]]
    return _error(422, "; ".join(parts) or "malformed request")


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    return _error(500, f"internal error: {type(exc).__name__}")  # Starlette still logs the traceback


EXCEPTION_HANDLERS: dict[Any, Callable[..., Any]] = {
    HTTPException: http_error,
    RequestValidationError: validation_error,
    Exception: unexpected_error,
}

HEALTH_SCHEMA = {
    "type": "object",
    "required": ["status", "engine", "collectors"],
    "properties": {
        "status": {"enum": ["ok", "degraded"]},
        "engine": {"anyOf": [{"type": "object"}, {"type": "null"}]},
        "collectors": {"type": "array", "items": {"type": "string"}},
    },
}
TOPOLOGY_SCHEMA = {
    "type": "object",
    "required": ["topology", "placement"],
    "properties": {"topology": {"type": "object"}, "placement": {"type": "object"}},
}

# The routes read the app's `agent` (an AgentState), which create_app sets on its state.
router = APIRouter()


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"description": "Prometheus text exposition", "content": {CONTENT_TYPE_LATEST.split(";")[0]: _TEXT}}
    },
)
def metrics(request: Request):
    return Response(request.app.state.agent.render_metrics(), media_type=CONTENT_TYPE_LATEST)


@router.get(
    "/healthz", responses=json_ok("the agent's liveness; degraded while its engine is not ready", HEALTH_SCHEMA)
)
def healthz(request: Request):
    return JSONResponse(request.app.state.agent.health())


@router.get(
    "/v1/topology",
    responses={
        **json_ok("the discovered topology and the engine's placement", TOPOLOGY_SCHEMA),
        503: {"description": "the topology could not be discovered (error says why)"},
    },
)
def topology(request: Request):
    state: AgentState = request.app.state.agent
    if state.topology is None:
        return _error(503, state.topology_error or "topology not discovered")
    return JSONResponse({"topology": state.topology, "placement": state.placement})


def _finish_document(doc: dict) -> dict:
    return document_errors(doc, ERROR_SCHEMA)


def create_app(state: AgentState, routers: Iterable[Any] = ()) -> FastAPI:
    app = FastAPI(title="inferd agent", docs_url=None, redoc_url=None, exception_handlers=EXCEPTION_HANDLERS)
    app.state.agent = state
    for extra in (router, *routers):
        app.include_router(extra)
    serve_document(app, DESCRIPTION, "webhookToken", _finish_document)
    return app


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
