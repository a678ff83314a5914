"""Llama 3.1 / 3.2 / 3.3 JSON tool calls, as their chat templates ask for them:

    {"name": "get_weather", "parameters": {"city": "Paris"}}

the whole reply being the JSON (several calls separated by `;`), optionally after the
`<|python_tag|>` token. "arguments" is accepted for "parameters" too. A reply that
starts with `{` but is not a call is content.
"""

from __future__ import annotations

from .base import PartialCall, ToolCall, ToolParser, parse_calls, partial_calls, skip_ws

PYTHON_TAG = "<|python_tag|>"
ARGUMENT_KEYS = ("parameters", "arguments")


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    markers = (PYTHON_TAG,)
    call_before, call_after, argument_key = "", "", "parameters"

    def find_start(self, text: str) -> int | None:
        i = text.find(PYTHON_TAG)
        if i >= 0:
            return i
        j = skip_ws(text, 0)
        return j if text.startswith("{", j) else None

    def may_start(self, text: str) -> bool:
        return not text.strip()

    @staticmethod
    def _body_start(section: str) -> int:
        return len(PYTHON_TAG) if section.startswith(PYTHON_TAG) else 0

    def parse_section(self, section: str) -> tuple[list[ToolCall], str] | None:
        try:
            calls, end = parse_calls(section, self._body_start(section), ARGUMENT_KEYS, ";", allow_trailing=True)
        except ValueError:
            return None
        return calls, section[end:]

    def partial_section(self, section: str) -> list[PartialCall]:
        return partial_calls(section, self._body_start(section), ARGUMENT_KEYS, ";")
