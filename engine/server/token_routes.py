"""vLLM's utility routes: /tokenize, /detokenize, /version and GET /v1/models/{model}.

Request and response shapes are vLLM's (vllm/entrypoints/openai/protocol.py), so
clients and gateways that count tokens through a vLLM server work unchanged:

- `POST /tokenize` takes `prompt` (a string; `add_special_tokens`, default true) or
  chat `messages` (+ `add_generation_prompt`, default true, and `tools`), rendered
  through the same chat template as /v1/chat/completions; it returns `count`,
  `max_model_len`, `tokens` and, with `return_token_strs`, `token_strs`. For messages,
  `add_special_tokens` defaults to what the chat route does, so the count is the
  prompt the engine would see: false when the model has a chat template (it writes its
  own BOS), true for the plain fallback template.
- `POST /detokenize` takes `tokens` and returns `prompt`; ids outside the tokenizer's
  vocabulary are a 400 naming them.
- `GET /version` returns `{"version": ...}`.
- `GET /v1/models/{model}` returns the served model's card; any other id is a 404 in
  OpenAI's error shape (code `model_not_found`).

The tokenizer lives in the API server process, so these answer while the model loads.
The handlers read the app's `serving` (app.py sets it on the app's state).
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from fastapi import APIRouter, Request
from pydantic import StrictBool

from inferd.openapi_doc import json_ok

from .api_models import ChatMessage, JsonInt, _Lenient, first_non_unicode
from .errors import ApiError, bad_request
from .serving import OpenAIServing
from .tool_parsers.tool_choice import tool_request


def inferd_version() -> str:
    try:
        return importlib.metadata.version("inferd")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"


class TokenizeRequest(_Lenient):
    """vLLM's TokenizeCompletionRequest and TokenizeChatRequest in one body: exactly one
    of `prompt` and `messages`."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    tools: list[dict[str, Any]] | None = None
    return_token_strs: StrictBool | None = False

    def check(self) -> None:
        where = first_non_unicode(self.model_dump(exclude_none=True))
        if where is not None:
            raise bad_request(
                f"{where} is not valid Unicode text (it holds a lone surrogate)", where, "invalid_encoding"
            )
        if (self.prompt is None) == (self.messages is None):
            raise bad_request("give exactly one of prompt and messages", "prompt" if self.prompt else "messages")
        self.check_unknown_fields()
        if self.messages is not None:
            if not self.messages:
                raise bad_request("messages must hold at least one message", "messages")
            for i, message in enumerate(self.messages):
                message.check_role(i)
                message.check_unknown_fields(f"messages[{i}].", "messages[].")
        elif self.tools:
            raise bad_request("tools are only allowed with messages", "tools")


class DetokenizeRequest(_Lenient):
    model: str | None = None
    tokens: list[JsonInt]


TOKENIZE_RESPONSE = {
    "type": "object",
    "required": ["count", "max_model_len", "tokens"],
    "properties": {
        "count": {"type": "integer"},
        "max_model_len": {"type": "integer"},
        "tokens": {"type": "array", "items": {"type": "integer"}},
        "token_strs": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
    },
}
DETOKENIZE_RESPONSE = {"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}
VERSION_RESPONSE = {"type": "object", "required": ["version"], "properties": {"version": {"type": "string"}}}
MODEL_CARD = {
    "type": "object",
    "required": ["id", "object", "max_model_len"],
    "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "max_model_len": {"type": "integer"}},
}


def document_token_schemas(schemas: dict) -> None:
    """What pydantic cannot say in the request schemas: exactly one of prompt and messages,
    token ids are not negative."""
    body = schemas["TokenizeRequest"]
    body["properties"]["prompt"] = {"title": "Prompt", "anyOf": [{"type": "string"}, {"type": "null"}]}
    messages = {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/ChatMessage"}}
    body["properties"]["messages"] = {"title": "Messages", "anyOf": [messages, {"type": "null"}]}
    # null is the same as leaving the field out: exactly one of the two is given and not null
    body["oneOf"] = [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
    ]
    body["additionalProperties"] = True
    tokens = schemas["DetokenizeRequest"]
    tokens["properties"]["tokens"]["items"] = {"type": "integer", "minimum": 0}
    tokens["additionalProperties"] = True


router = APIRouter()


@router.post(
    "/tokenize",
    responses={
        **json_ok("the prompt's token ids", TOKENIZE_RESPONSE),
        400: {
            "description": "the body is not a JSON object of the documented types, neither or both of prompt "
            "and messages, a refused field, or a bad message"
        },
        404: {"description": "the model does not exist"},
    },
)
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    serving: OpenAIServing = request.app.state.serving
    body.check()
    serving.check_model(body.model)
    if body.messages is not None:
        tools = tool_request(body.tools, None, None)
        text = serving.chat_prompt(body.messages, body.add_generation_prompt, tools)
        default_special = serving.chat_adds_special_tokens
    else:
        assert body.prompt is not None
        text, default_special = body.prompt, True
    add_special = default_special if body.add_special_tokens is None else body.add_special_tokens
    ids = await serving.encode(text, add_special)
    return {
        "count": len(ids),
        "max_model_len": serving.max_model_len,
        "tokens": ids,
        "token_strs": [serving.tokenizer.id_to_token(i) or "" for i in ids] if body.return_token_strs else None,
    }


@router.post(
    "/detokenize",
    responses={
        **json_ok("the text of the token ids", DETOKENIZE_RESPONSE),
        400: {
            "description": "the body is not a JSON object of the documented types, or a token id outside the "
            "tokenizer's vocabulary"
        },
        404: {"description": "the model does not exist"},
    },
)
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, str]:
    serving: OpenAIServing = request.app.state.serving
    tok = serving.tokenizer
    body.check_unknown_fields()
    serving.check_model(body.model)
    bad = [t for t in body.tokens if not 0 <= t < tok.vocab_size]
    if bad:
        raise bad_request(f"tokens has unknown token id(s) {bad[:5]}; vocabulary is [0, {tok.vocab_size})", "tokens")
    return {"prompt": tok.decode(body.tokens, skip_special_tokens=False)}


@router.get("/version", responses=json_ok("the server's version", VERSION_RESPONSE))
async def version() -> dict[str, str]:
    return {"version": inferd_version()}


@router.get(
    "/v1/models/{model:path}",  # served names often hold a slash (org/model)
    responses={**json_ok("the model's card", MODEL_CARD), 404: {"description": "no model has this id"}},
)
async def model_card(model: str, request: Request) -> dict[str, Any]:
    serving: OpenAIServing = request.app.state.serving
    if model != serving.model_name:
        raise ApiError(404, f"The model `{model}` does not exist.", "model", "model_not_found")
    [card] = serving.models()["data"]
    return card
