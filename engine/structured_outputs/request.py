"""The request fields that ask for structured outputs, as OpenAI and vLLM spell them,
turned into one StructuredOutputsParams:

- OpenAI `response_format`: `{"type": "text"}`, `{"type": "json_object"}`,
  `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`;
- vLLM's older extras `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`;
- vLLM's `structured_outputs` object: `{"json": ...}`, `{"regex": ...}`, `{"choice": [...]}`,
  `{"grammar": ...}`, `{"json_object": true}`.

At most one of them may constrain a request. The grammar is built here too (xgrammar
parses it without the tokenizer), so an invalid schema, regex or grammar is refused
before it reaches the engine, naming the request field it came in; so is one over the
size limits (limits.py), and a schema whose `$ref` points outside
itself (a URL or file is never fetched: it would compile unconstrained).
"""

from __future__ import annotations

import json as _json
from typing import Any

from .grammar import build_grammar
from .limits import StructuredOutputsLimits, remote_ref
from .params import StructuredOutputsParams


class StructuredOutputsRequestError(ValueError):
    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_STRUCTURED_KEYS = ("json", "json_object", "regex", "choice", "grammar")
# vLLM's structured_outputs options that only tune its backends; accepted, no effect here.
_STRUCTURED_IGNORED = (
    "disable_any_whitespace",
    "disable_additional_properties",
    "disable_fallback",
    "whitespace_pattern",
)


def _from_response_format(value: Any) -> tuple[dict[str, Any], str] | None:
    if not isinstance(value, dict):
        raise StructuredOutputsRequestError("response_format must be an object with a type", "response_format")
    if "type" not in value:
        raise StructuredOutputsRequestError(
            "response_format.type is required: text, json_object or json_schema", "response_format.type"
        )
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}, "response_format"
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise StructuredOutputsRequestError(
                "response_format.json_schema must be an object with name and schema", "response_format.json_schema"
            )
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise StructuredOutputsRequestError(
                "response_format.json_schema.schema must be a JSON schema object", "response_format.json_schema.schema"
            )
        return {"json": schema}, "response_format.json_schema.schema"
    raise StructuredOutputsRequestError(
        f"response_format.type must be text, json_object or json_schema; got {kind!r}", "response_format.type"
    )


def _from_structured(value: Any) -> tuple[dict[str, Any], str]:
    if not isinstance(value, dict):
        raise StructuredOutputsRequestError("structured_outputs must be an object", "structured_outputs")
    unknown = [k for k in value if k not in _STRUCTURED_KEYS and k not in _STRUCTURED_IGNORED]
    if unknown:
        raise StructuredOutputsRequestError(
            f"structured_outputs.{unknown[0]} is not supported; use one of {', '.join(_STRUCTURED_KEYS)}",
            f"structured_outputs.{unknown[0]}",
        )
    fields = {k: v for k, v in value.items() if k in _STRUCTURED_KEYS and v is not None and v is not False}
    if len(fields) != 1:
        raise StructuredOutputsRequestError(
            f"structured_outputs needs exactly one of {', '.join(_STRUCTURED_KEYS)}", "structured_outputs"
        )
    key = next(iter(fields))
    return fields, f"structured_outputs.{key}"


def structured_outputs_from_request(
    response_format: Any = None,
    structured_outputs: Any = None,
    limits: StructuredOutputsLimits | None = None,
    **guided: Any,
) -> StructuredOutputsParams | None:
    """The constraint the request asks for, checked (limits and grammar included), or None;
    StructuredOutputsRequestError naming the field otherwise. `guided`: the guided_* fields."""
    found: list[tuple[dict[str, Any], str]] = []
    if response_format is not None:
        from_format = _from_response_format(response_format)
        if from_format is not None:
            found.append(from_format)
    if structured_outputs is not None:
        found.append(_from_structured(structured_outputs))
    for name, value in guided.items():
        if name not in _GUIDED:
            raise TypeError(f"unexpected field {name}")
        if value is not None:
            found.append(({_GUIDED[name]: value}, name))
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(param.split(".")[0] for _, param in found)
        raise StructuredOutputsRequestError(
            f"only one structured-outputs constraint per request; got {names}", found[1][1]
        )
    fields, param = found[0]
    try:
        params = StructuredOutputsParams(**fields)
        check_constraint(params, limits or StructuredOutputsLimits())
    except ValueError as exc:
        raise StructuredOutputsRequestError(_renamed(str(exc), param), param) from None
    return params


def check_constraint(params: StructuredOutputsParams, limits: StructuredOutputsLimits) -> None:
    """A ValueError starting with the constraint's field (structured_outputs.json, ...)
    when `params` is over a limit, refers outside itself, or does not build a grammar."""
    limits.check(params)
    if params.json is not None:
        ref = remote_ref(_json.loads(params.schema_text or "{}"))
        if ref is not None:
            raise ValueError(
                f"structured_outputs.json has $ref {ref!r}: only references into the schema itself "
                "(#/$defs/...) are supported"
            )
    build_grammar(params)


def _renamed(message: str, param: str) -> str:
    """`message` about structured_outputs.<kind>, told in terms of the request's `param`."""
    for prefix in (f"structured_outputs.{k}" for k in sorted(_STRUCTURED_KEYS, key=len, reverse=True)):
        if message.startswith(prefix):
            return param + message[len(prefix) :]
    return f"{param}: {message}"
