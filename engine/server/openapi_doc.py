"""The engine's OpenAPI document: what FastAPI cannot derive from the routes.

Every status each route answers with, the error shape (`ERROR_SCHEMA`) on every 4xx and
5xx response, the values the request checks accept written into the request schemas,
the X-Request-Id header on every response and the X-SLO-Class request header.
`finish_document` writes them into FastAPI's document (inferd.openapi_doc serves it).
"""

from __future__ import annotations

from typing import Any

from inferd.openapi_doc import document_errors

from ..request.slo import CLASS_NAME
from .api_models import CHAT_ROLES, MAX_REPETITION_PENALTY, MIN_REPETITION_PENALTY
from .token_routes import document_token_schemas

DESCRIPTION = "OpenAI-compatible completions, health, metrics and the admin API"

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
NOT_READY = "the engine core is not running (engine_dead); /ready also: loading, engine_stalled or draining"
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


def document_request_values(schemas: dict) -> None:
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


def generation_ok(choice: dict) -> dict:
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


def _document_operation(operation: dict[str, Any]) -> None:
    """The common errors and the X-Request-Id header on `operation`; FastAPI's automatic
    422 becomes the 400 this server answers."""
    responses = operation["responses"]
    fastapi_422 = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema", {})
    if fastapi_422.get("$ref") == "#/components/schemas/HTTPValidationError":
        del responses["422"]  # a path parameter alone (a string) never fails validation
        if "requestBody" in operation or any(p["in"] != "path" for p in operation.get("parameters", [])):
            responses.setdefault("400", {"description": "the request is not of the documented types"})
    for code, text in COMMON_ERRORS.items():
        responses.setdefault(str(code), {"description": text})
    for response in responses.values():
        response.setdefault("headers", {})["X-Request-Id"] = REQUEST_ID_RESPONSE_HEADER


def finish_document(doc: dict) -> dict:
    """FastAPI's document of the engine's routes, with what it cannot derive written in."""
    document_request_values(doc["components"]["schemas"])
    document_token_schemas(doc["components"]["schemas"])
    return document_errors(doc, ERROR_SCHEMA, _document_operation)
