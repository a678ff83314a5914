"""The OpenAI routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models.

The handlers read the app's state (app.py sets it): `serving` does the work, `drain`
refuses new generations once the server is shutting down. No return annotations: FastAPI
would take them for response models, and the document would change.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from inferd.openapi_doc import json_ok

from .api_models import ChatCompletionRequest, CompletionRequest
from .openapi_doc import SLO_CLASS_PARAMETER, generation_ok

_FINISH_REASON = {"anyOf": [{"type": "string"}, {"type": "null"}]}
TEXT_CHOICE = {"text": {"type": "string"}, "finish_reason": _FINISH_REASON}
CHAT_CHOICE = {
    "message": {"type": "object", "properties": {"role": {"type": "string"}, "content": {"type": "string"}}},
    "finish_reason": _FINISH_REASON,
}
MODEL_LIST = {
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
_SLO_HEADER = {"parameters": [SLO_CLASS_PARAMETER]}

router = APIRouter()


@router.post("/v1/completions", responses=generation_ok(TEXT_CHOICE), openapi_extra=_SLO_HEADER)
async def completions(body: CompletionRequest, request: Request):
    request.app.state.drain.check()
    return await request.app.state.serving.completions(body, request)


@router.post("/v1/chat/completions", responses=generation_ok(CHAT_CHOICE), openapi_extra=_SLO_HEADER)
async def chat_completions(body: ChatCompletionRequest, request: Request):
    request.app.state.drain.check()
    return await request.app.state.serving.chat_completions(body, request)


@router.get("/v1/models", responses=json_ok("the served model", MODEL_LIST))
async def models(request: Request):
    return request.app.state.serving.models()
