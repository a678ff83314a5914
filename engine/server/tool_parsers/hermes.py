"""Hermes-style tool calls, as Qwen 2.5 and Hermes models write them:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, after optional text; the last block's closing tag may be missing
when the model stopped right after the JSON.
"""

from __future__ import annotations

from .base import PartialCall, ToolCall, ToolParser, parse_call_object, partial_call_object, skip_ws

OPEN, CLOSE = "<tool_call>", "</tool_call>"
ARGUMENT_KEYS = ("arguments", "parameters")


class HermesToolParser(ToolParser):
    name = "hermes"
    markers = (OPEN,)
    call_before, call_after, argument_key = "<tool_call>\n", "\n</tool_call>", "arguments"

    def find_start(self, text: str) -> int | None:
        i = text.find(OPEN)
        return None if i < 0 else i

    def parse_section(self, section: str) -> tuple[list[ToolCall], str] | None:
        calls: list[ToolCall] = []
        i = 0
        while section.startswith(OPEN, skip_ws(section, i)):
            try:
                call, i = parse_call_object(section, skip_ws(section, i) + len(OPEN), ARGUMENT_KEYS)
            except ValueError:
                return None
            calls.append(call)
            j = skip_ws(section, i)
            if section.startswith(CLOSE, j):
                i = j + len(CLOSE)
            elif j < len(section):
                return None  # something other than the closing tag follows the JSON
            else:
                i = j
        return calls, section[i:]

    def partial_section(self, section: str) -> list[PartialCall]:
        calls: list[PartialCall] = []
        i = 0
        while section.startswith(OPEN, skip_ws(section, i)):
            found = partial_call_object(section, skip_ws(section, i) + len(OPEN), ARGUMENT_KEYS)
            if found is None:
                break
            partial, i = found
            calls.append(partial)
            if not partial.is_complete:
                break
            j = skip_ws(section, i)
            if not section.startswith(CLOSE, j):
                break
            i = j + len(CLOSE)
        return calls
