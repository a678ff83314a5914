"""What probes and Prometheus read: GET /health, GET /ready, GET /metrics.

- `/health` is liveness: 200 while the engine core process lives, 503 once it is dead.
- `/ready` is readiness: 200 only when the core has reported ready and has been heard
  from within its stall bound; else 503 with the reason as the error code: `loading`,
  `engine_stalled`, `engine_dead` or `draining`.

The handlers read the app's state (app.py sets it): `engine`, `drain` and `metrics`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inferd.openapi_doc import json_ok

from .errors import RETRY_AFTER_S, error_response
from .openapi_doc import NOT_READY

router = APIRouter()


@router.get(
    "/health",
    response_class=Response,
    responses={
        200: {"description": "the engine core process lives (empty body)", "content": {}},
        503: {"description": NOT_READY.split(";")[0]},
    },
)
async def health(request: Request):
    engine = request.app.state.engine
    if not engine.is_alive:
        return error_response(503, f"the engine core is not running ({engine.state})", None, "engine_dead")
    return Response(status_code=200)


@router.get(
    "/ready",
    responses={
        **json_ok(
            "ready to serve",
            {"type": "object", "required": ["status"], "properties": {"status": {"const": "ready"}}},
        ),
        503: {"description": NOT_READY},
    },
)
async def ready(request: Request):
    engine = request.app.state.engine
    state = "draining" if request.app.state.drain.active and engine.is_alive else engine.state
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


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition",
            "content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
        }
    },
)
async def prometheus_metrics(request: Request):
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
