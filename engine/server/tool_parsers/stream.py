"""A choice's growing text -> OpenAI chat deltas: content, then tool calls.

Content goes out as it comes, except a tail that may be the start of a tool-call
marker. Once a section starts, each call is announced (index, id, type, name, empty
arguments) as soon as its name is written and names an offered function, then its
arguments follow as fragments of the text the model writes. The finished text is parsed
once more, authoritatively: what was not sent yet goes out, and a section that turned
out malformed is sent as content.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from .base import ToolParser, new_call_id

T = TypeVar("T")


@dataclass(slots=True)
class _SentCall:
    id: str
    name: str
    arguments: str = ""


@dataclass(slots=True)
class StreamDelta:
    content: str
    tool_calls: list[dict[str, Any]]
    is_tool_call: bool
    """The finished text parsed as calls: the choice finishes with finish_reason tool_calls."""


class ToolCallStream:
    def __init__(self, parser: ToolParser, tool_names: Iterable[str], max_calls: int = 0):
        """`max_calls` > 0 sends only the first calls (parallel_tool_calls false: one)."""
        self.parser = parser
        self.names = set(tool_names)
        self.max_calls = max_calls
        self.sent_content = 0
        self.section_start: int | None = None
        self.calls: list[_SentCall] = []

    def _content(self, text: str, end: int) -> str:
        if end <= self.sent_content:
            return ""
        delta = text[self.sent_content : end]
        self.sent_content = end
        return delta

    def update(self, text: str, finished: bool) -> StreamDelta:
        if finished:
            return self._finish(self.parser.strip_eos(text))
        if self.section_start is None:
            start = self.parser.find_start(text)
            if start is None:
                held = len(text) if self.parser.may_start(text) else self.parser.held_tail(text)
                return StreamDelta(self._content(text, len(text) - held), [], False)
            self.section_start = start
        content = self._content(text, self.section_start)
        deltas: list[dict[str, Any]] = []
        for k, partial in enumerate(self._limit(self.parser.partial_section(text[self.section_start :]))):
            if partial.name is None or partial.name not in self.names:
                break
            if k == len(self.calls):
                self.calls.append(_SentCall(new_call_id(), partial.name))
                deltas.append(self._announce(k))
            sent = self.calls[k]
            if len(partial.arguments) > len(sent.arguments) and partial.arguments.startswith(sent.arguments):
                deltas.append({"index": k, "function": {"arguments": partial.arguments[len(sent.arguments) :]}})
                sent.arguments = partial.arguments
        return StreamDelta(content, deltas, bool(self.calls))

    def _announce(self, k: int) -> dict[str, Any]:
        call = self.calls[k]
        return {"index": k, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}

    def _finish(self, text: str) -> StreamDelta:
        parsed = self.parser.parse(text, self.names)
        if parsed is None:  # calls announced before the text went bad stay sent, unfinished
            return StreamDelta(self._content(text, len(text)), [], False)
        start, calls, rest = parsed
        content = self._content(text, start)
        if rest.strip():
            content += rest
        deltas: list[dict[str, Any]] = []
        for k, call in enumerate(self._limit(calls)):
            if k == len(self.calls):
                self.calls.append(_SentCall(new_call_id(), call.name))
                deltas.append(self._announce(k))
            sent = self.calls[k]
            if call.arguments.startswith(sent.arguments) and len(call.arguments) > len(sent.arguments):
                deltas.append({"index": k, "function": {"arguments": call.arguments[len(sent.arguments) :]}})
                sent.arguments = call.arguments
        return StreamDelta(content, deltas, True)

    def _limit(self, calls: list[T]) -> list[T]:
        return calls[: self.max_calls] if self.max_calls > 0 else calls

    @property
    def sent_ids(self) -> list[str]:
        return [c.id for c in self.calls]
