"""Mistral tool calls: the `[TOOL_CALLS]` token, then a JSON list of calls

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]

(a single object is accepted too), or, with the newer tokenizers (v11+), one
`[TOOL_CALLS]name[ARGS]{...}` per call. `[TOOL_CALLS]` is a special token, so requests
parsed this way decode with special tokens kept (as vLLM does) and the end-of-sequence
text is stripped here.
"""

from __future__ import annotations

import json
import re

from .base import (
    PartialCall,
    ToolCall,
    ToolParser,
    open_value_end,
    parse_call_list,
    parse_call_object,
    partial_call_list,
    partial_call_object,
    skip_ws,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
ARGUMENT_KEYS = ("arguments", "parameters")
_NAMED = re.compile(r"\s*([A-Za-z0-9_.-]+)\s*" + re.escape(ARGS))


class MistralToolParser(ToolParser):
    name = "mistral"
    markers = (TOOL_CALLS,)
    keeps_special_tokens = True
    call_before, call_after, argument_key = "[TOOL_CALLS] [", "]", "arguments"

    def find_start(self, text: str) -> int | None:
        i = text.find(TOOL_CALLS)
        return None if i < 0 else i

    def parse_section(self, section: str) -> tuple[list[ToolCall], str] | None:
        i = skip_ws(section, len(TOOL_CALLS))
        try:
            if section.startswith("[", i):
                return parse_call_list(section, i, ARGUMENT_KEYS)
            if section.startswith("{", i):
                call, end = parse_call_object(section, i, ARGUMENT_KEYS)
                return [call], section[end:]
            return self._parse_named(section)
        except ValueError:
            return None

    @staticmethod
    def _parse_named(section: str) -> tuple[list[ToolCall], str]:
        calls: list[ToolCall] = []
        i = 0
        while section.startswith(TOOL_CALLS, i):
            m = _NAMED.match(section, i + len(TOOL_CALLS))
            if m is None:
                raise ValueError("expected name[ARGS]")
            start = skip_ws(section, m.end())
            value, end = json.JSONDecoder().raw_decode(section, start)
            if not isinstance(value, dict):
                raise ValueError("arguments are not a JSON object")
            calls.append(ToolCall(m.group(1), section[start:end]))
            i = skip_ws(section, end)
        return calls, section[i:]

    def partial_section(self, section: str) -> list[PartialCall]:
        i = skip_ws(section, len(TOOL_CALLS))
        if section.startswith("{", i):
            found = partial_call_object(section, i, ARGUMENT_KEYS)
            return [found[0]] if found else []
        if not section.startswith("[", i):
            return self._partial_named(section)
        return partial_call_list(section, i, ARGUMENT_KEYS)

    @staticmethod
    def _partial_named(section: str) -> list[PartialCall]:
        calls: list[PartialCall] = []
        i = 0
        while section.startswith(TOOL_CALLS, i):
            m = _NAMED.match(section, i + len(TOOL_CALLS))
            if m is None:
                return calls
            start = skip_ws(section, m.end())
            if not section.startswith("{", start):
                calls.append(PartialCall(m.group(1), "", False))
                return calls
            end = open_value_end(section, start)
            if end is None:
                calls.append(PartialCall(m.group(1), section[start:], False))
                return calls
            calls.append(PartialCall(m.group(1), section[start:end], True))
            i = skip_ws(section, end)
        return calls
