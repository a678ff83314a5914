"""Forced tool calls on a model whose chat template names no tool-call format: vLLM's JSON.

With no format to write a call in (no --tool-call-parser, and a template that names
none), `tool_choice` "required" is generated, under structured outputs, as a JSON array
of calls with one schema branch per offered tool (its name as a constant and its
parameters),

    [{"name": "get_weather", "parameters": {"city": "Paris"}}]

and a named function as that function's arguments object alone. Both parse back into
`tool_calls` here, whole or as a stream grows, so a forced call works with any chat
template. vLLM does the same (vllm/tool_parsers/utils.py get_json_schema_from_tools, and
its chat serving's "required" and named-function paths); as there, `auto` still needs a
format, since a model writes neither of these unasked.
"""

from __future__ import annotations

import json
from typing import Any

from .base import (
    NO_PARAMETERS,
    PartialCall,
    ToolCall,
    ToolParser,
    hoist_defs,
    open_value_end,
    parse_call_list,
    partial_call_list,
    skip_ws,
)

ARGUMENT_KEYS = ("parameters",)
_DECODER = json.JSONDecoder()


class JsonArrayToolParser(ToolParser):
    """tool_choice "required": a JSON array of {"name", "parameters"} objects."""

    name = "json_array"
    argument_key = "parameters"

    def find_start(self, text: str) -> int | None:
        i = skip_ws(text, 0)
        return i if text.startswith("[", i) else None

    def may_start(self, text: str) -> bool:
        return not text.strip()

    def parse_section(self, section: str) -> tuple[list[ToolCall], str] | None:
        try:
            return parse_call_list(section, 0, ARGUMENT_KEYS)
        except ValueError:
            return None

    def partial_section(self, section: str) -> list[PartialCall]:
        return partial_call_list(section, 0, ARGUMENT_KEYS)

    def forced_schema(self, tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
        parameters, defs = hoist_defs([t["function"].get("parameters") or NO_PARAMETERS for t in tools])
        branches = [
            {
                "type": "object",
                "properties": {"name": {"const": t["function"]["name"]}, "parameters": p},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for t, p in zip(tools, parameters, strict=True)
        ]
        schema: dict[str, Any] = {
            "type": "array",
            "minItems": 1,
            "items": branches[0] if len(branches) == 1 else {"anyOf": branches},
        }
        if not parallel:  # one call, rather than several of which all but the first are dropped
            schema["maxItems"] = 1
        if defs:
            schema["$defs"] = defs
        return schema


class NamedArgumentsToolParser(ToolParser):
    """A named function: the reply is its arguments object."""

    name = "named_arguments"

    def __init__(self, function_name: str):
        super().__init__(None)
        self.function_name = function_name

    def find_start(self, text: str) -> int | None:
        i = skip_ws(text, 0)
        return i if text.startswith("{", i) else None

    def may_start(self, text: str) -> bool:
        return not text.strip()

    def parse_section(self, section: str) -> tuple[list[ToolCall], str] | None:
        try:
            value, end = _DECODER.raw_decode(section)
        except ValueError:
            return None
        if not isinstance(value, dict):
            return None
        return [ToolCall(self.function_name, section[:end])], section[end:]

    def partial_section(self, section: str) -> list[PartialCall]:
        end = open_value_end(section, 0)
        if end is None:
            return [PartialCall(self.function_name, section, False)]
        return [PartialCall(self.function_name, section[:end], True)]

    def forced_schema(self, tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
        (tool,) = tools
        return tool["function"].get("parameters") or NO_PARAMETERS


def forced_json_parser(choice: str, named: str | None) -> ToolParser:
    """The parser of a forced call ("required" or "named") on a model with no format."""
    if choice == "named":
        assert named is not None
        return NamedArgumentsToolParser(named)
    if choice == "required":
        return JsonArrayToolParser()
    raise ValueError(f"only a forced call has a format of its own; got tool_choice {choice!r}")
