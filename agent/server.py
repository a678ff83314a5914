"""The agent's HTTP app (port 9400): /metrics, /healthz, /v1/topology.

Hooks for other agent modules: `AgentState` is the narrow object the routes read, and
`create_app(state, routers)` mounts extra FastAPI routers. `agent.main` mounts the
router of `agent.webhook` when that module exists: it must define
`make_router(state: AgentState) -> fastapi.APIRouter` and serves `/v1/alerts`
(Alertmanager webhook) and `/v1/actions` from it; state.engine_metrics and
state.supervisor give it the engine's readings and process.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from agent.supervisor import Supervisor
from exporters.engine_metrics import EngineMetricsReader
from exporters.registry import CollectorSet


@dataclass(slots=True)
class AgentState:
    collectors: CollectorSet
    registry: CollectorRegistry
    topology: dict[str, Any] | None = None  # agent.topology.Topology.to_dict() when discovered
    topology_error: str | None = None
    placement: dict[str, Any] = field(default_factory=dict)  # chosen node, cpus, binding
    supervisor: Supervisor | None = None
    engine_metrics: EngineMetricsReader | None = None
    engine_url: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # room for other modules' state

    @classmethod
    def with_collectors(cls, collectors: Iterable, **kwargs) -> "AgentState":
        collector_set = CollectorSet(collectors)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector_set)
        return cls(collectors=collector_set, registry=registry, **kwargs)

    def render_metrics(self) -> bytes:
        return generate_latest(self.registry)

    def health(self) -> dict[str, Any]:
        supervisor = self.supervisor
        engine = None
        if supervisor is not None:
            engine = {
                "up": supervisor.is_up,
                "pid": supervisor.pid,
                "restarts": supervisor.restarts,
                "error": supervisor.error,
                "binding": supervisor.binding,
                "url": self.engine_url,
            }
        healthy = supervisor is None or not supervisor.has_given_up
        return {"status": "ok" if healthy else "engine_failed", "engine": engine, "collectors": self.collectors.names}


def create_app(state: AgentState, routers: Iterable[Any] = ()):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, Response

    app = FastAPI(title="inferd agent", docs_url=None, redoc_url=None)
    app.state.agent = state

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(state.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        body = state.health()
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/v1/topology")
    def topology() -> JSONResponse:
        if state.topology is None:
            return JSONResponse({"error": state.topology_error or "topology not discovered"}, status_code=503)
        return JSONResponse({"topology": state.topology, "placement": state.placement})

    for router in routers:
        app.include_router(router)
    return app


def load_extra_routers(state: AgentState, modules: Iterable[str] = ("agent.webhook",), log: Callable[[str], None] = print):
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
