"""What every tool-call format shares: the parsed call, the JSON scanning, the streaming diff.

A format (one file each) says where its tool-call section starts in the model's text
(`find_start`) and how to read the calls in it (`parse_section`, `partial_section`);
everything else lives here. Arguments are kept as the exact JSON text the model wrote
(checked to parse), so the fragments a stream sends concatenate to the same string a
non-streaming response carries. Output that does not parse as calls to offered tools is
plain content, never an error.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

_DECODER = json.JSONDecoder()
_WS = re.compile(r"\s*")
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str
    """The arguments object as JSON text."""
    id: str = field(default_factory=new_call_id)

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class ExtractedToolCalls:
    content: str | None
    tool_calls: list[ToolCall]

    @property
    def is_tool_call(self) -> bool:
        return bool(self.tool_calls)


@dataclass(slots=True)
class PartialCall:
    """A call as far as a stream has written it."""

    name: str | None
    arguments: str
    """The arguments' JSON text written so far (all of it once `is_complete`)."""
    is_complete: bool


def skip_ws(text: str, i: int) -> int:
    m = _WS.match(text, i)
    return m.end() if m else i


def parse_object_spans(text: str, i: int) -> tuple[dict[str, tuple[Any, int, int]], int]:
    """The JSON object starting at text[i]: {key: (value, value start, value end)} and the
    index after its closing brace. ValueError when it is not a whole, valid object."""
    i = skip_ws(text, i)
    if i >= len(text) or text[i] != "{":
        raise ValueError("not an object")
    fields: dict[str, tuple[Any, int, int]] = {}
    i = skip_ws(text, i + 1)
    if i < len(text) and text[i] == "}":
        return fields, i + 1
    while True:
        key, i = _DECODER.raw_decode(text, skip_ws(text, i))
        if not isinstance(key, str):
            raise ValueError("object key is not a string")
        i = skip_ws(text, i)
        if i >= len(text) or text[i] != ":":
            raise ValueError("expected ':'")
        start = skip_ws(text, i + 1)
        value, end = _DECODER.raw_decode(text, start)
        fields[key] = (value, start, end)
        i = skip_ws(text, end)
        if i < len(text) and text[i] == ",":
            i += 1
            continue
        if i < len(text) and text[i] == "}":
            return fields, i + 1
        raise ValueError("expected ',' or '}'")


def parse_call_object(text: str, i: int, argument_keys: tuple[str, ...]) -> tuple[ToolCall, int]:
    """One `{"name": ..., "<argument key>": {...}}` object at text[i]; ValueError otherwise."""
    fields, end = parse_object_spans(text, i)
    name = fields.get("name", (None, 0, 0))[0]
    if not isinstance(name, str) or not name:
        raise ValueError("a tool call needs a string name")
    keys = [k for k in argument_keys if k in fields]
    if not keys:
        return ToolCall(name, "{}"), end  # a function without parameters may be called bare
    value, start, stop = fields[keys[0]]
    if isinstance(value, str):  # some models write the arguments as a JSON string
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError("arguments are not a JSON object") from None
        if not isinstance(value, dict):
            raise ValueError("arguments are not a JSON object")
        return ToolCall(name, json.dumps(value, ensure_ascii=False)), end
    if not isinstance(value, dict):
        raise ValueError("arguments are not a JSON object")
    return ToolCall(name, text[start:stop]), end


_NAME_THEN_ARGS = r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:%s)"\s*:\s*'


def open_value_end(text: str, start: int) -> int | None:
    """Where the JSON object or array starting at text[start] ends (the index after its
    closing bracket), or None while it is still open. Only brackets and strings are
    tracked: validity is checked once the value is whole."""
    depth, in_string, escaped = 0, False, False
    for j in range(start, len(text)):
        c = text[j]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
    return None


def partial_call_object(text: str, i: int, argument_keys: tuple[str, ...]) -> tuple[PartialCall, int] | None:
    """A call object at text[i] as far as it is written: the name once its string is
    closed, then the arguments' text so far. None when nothing can be said yet (or the
    keys come in another order; the whole call is then sent once it parses)."""
    try:
        call, end = parse_call_object(text, i, argument_keys)
        return PartialCall(call.name, call.arguments, True), end
    except ValueError:
        pass
    pattern = re.compile(_NAME_THEN_ARGS % "|".join(re.escape(k) for k in argument_keys))
    m = pattern.match(text, i)
    if m is None:
        return None
    try:
        name = json.loads(f'"{m.group(1)}"')
    except ValueError:
        return None
    start = m.end()
    if start >= len(text) or text[start] != "{":
        return PartialCall(name, "", False), len(text)
    whole = open_value_end(text, start)
    if whole is not None:  # the arguments are whole; the call's own brace is still to come
        return PartialCall(name, text[start:whole], False), whole
    return PartialCall(name, text[start:], False), len(text)


def parse_calls(
    text: str, i: int, argument_keys: tuple[str, ...], separator: str, allow_trailing: bool = False
) -> tuple[list[ToolCall], int]:
    """The call objects from text[i] on with `separator` between them, and the index after
    the last one (the end of text when `allow_trailing` and only whitespace follows a last
    separator); ValueError when one does not parse."""
    calls: list[ToolCall] = []
    while True:
        call, i = parse_call_object(text, i, argument_keys)
        calls.append(call)
        j = skip_ws(text, i)
        if not text.startswith(separator, j):
            return calls, i
        i = j + len(separator)
        if allow_trailing and not text[i:].strip():
            return calls, len(text)


def partial_calls(text: str, i: int, argument_keys: tuple[str, ...], separator: str) -> list[PartialCall]:
    """The calls from text[i] on with `separator` between them, as far as they are written."""
    calls: list[PartialCall] = []
    while True:
        found = partial_call_object(text, i, argument_keys)
        if found is None:
            return calls
        partial, i = found
        calls.append(partial)
        j = skip_ws(text, i)
        if not partial.is_complete or not text.startswith(separator, j):
            return calls
        i = j + len(separator)


def parse_call_list(text: str, i: int, argument_keys: tuple[str, ...]) -> tuple[list[ToolCall], str]:
    """The call objects of a JSON array whose "[" is at text[i], and the text after its "]";
    ValueError when it is not one."""
    calls, i = parse_calls(text, i + 1, argument_keys, ",")
    i = skip_ws(text, i)
    if not text.startswith("]", i):
        raise ValueError("expected ',' or ']'")
    return calls, text[i + 1 :]


def partial_call_list(text: str, i: int, argument_keys: tuple[str, ...]) -> list[PartialCall]:
    """The calls of a JSON array whose "[" is at text[i], as far as they are written."""
    return partial_calls(text, i + 1, argument_keys, ",")


def hoist_defs(parameters: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The tools' parameters schemas without their `$defs`, and those definitions joined:
    nested inside a call's schema, a `#/$defs/...` reference must find them at the root.
    ValueError when two tools define one name differently (vLLM refuses that too)."""
    stripped: list[dict[str, Any]] = []
    defs: dict[str, Any] = {}
    for schema in parameters:
        own = schema.get("$defs")
        if not isinstance(own, dict):
            stripped.append(schema)
            continue
        for name, definition in own.items():
            if name in defs and defs[name] != definition:
                raise ValueError(f"$defs {name!r} is defined differently by two tools")
            defs[name] = definition
        stripped.append({k: v for k, v in schema.items() if k != "$defs"})
    return stripped, defs


class ToolParser:
    """A tool-call format. Subclasses set `name`, `markers` and the three methods."""

    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]] = ()
    """Text that opens a tool-call section; a stream holds back a tail that may become one."""
    keeps_special_tokens: ClassVar[bool] = False
    """The marker is a special token: requests decode with skip_special_tokens off."""
    call_before: ClassVar[str] = ""
    call_after: ClassVar[str] = ""
    """The text around one call's JSON object, as the format writes it (a forced call is
    generated as before + JSON + after)."""
    argument_key: ClassVar[str] = "arguments"

    def __init__(self, eos_token: str | None = None):
        # With special tokens kept, the end-of-sequence token's text ends the output.
        self.eos_token = eos_token if self.keeps_special_tokens else None

    # --- the format -------------------------------------------------------------------
    def find_start(self, text: str) -> int | None:
        """Index where the tool-call section starts, or None."""
        raise NotImplementedError

    def parse_section(self, section: str) -> tuple[list[ToolCall], str] | None:
        """The calls in a whole section and any text after them; None when malformed."""
        raise NotImplementedError

    def partial_section(self, section: str) -> list[PartialCall]:
        """The calls of a section still being written."""
        raise NotImplementedError

    def may_start(self, text: str) -> bool:
        """Whether text with no section yet could still turn into one (held back in streams)."""
        return False

    # --- shared -------------------------------------------------------------------------
    def call_schema(self, tools: list[dict[str, Any]]) -> dict[str, Any]:
        """JSON schema of one call's object to any of `tools` (OpenAI tool definitions)."""
        parameters, defs = hoist_defs([t["function"].get("parameters") or NO_PARAMETERS for t in tools])
        branches = [
            {
                "type": "object",
                "properties": {"name": {"const": tool["function"]["name"]}, self.argument_key: params},
                "required": ["name", self.argument_key],
                "additionalProperties": False,
            }
            for tool, params in zip(tools, parameters, strict=True)
        ]
        schema = branches[0] if len(branches) == 1 else {"anyOf": branches}
        return {**schema, "$defs": defs} if defs else schema

    def forced_schema(self, tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
        """JSON schema a forced call to one of `tools` is generated under, between
        `call_before` and `call_after`: one call in the format's own JSON."""
        return self.call_schema(tools)

    def strip_eos(self, text: str) -> str:
        if self.eos_token and text.endswith(self.eos_token):
            return text[: -len(self.eos_token)]
        return text

    def parse(self, text: str, tool_names: Iterable[str]) -> tuple[int, list[ToolCall], str] | None:
        """(section start, calls, text after them) of a whole output (its end-of-sequence
        text stripped); None when there are no calls, they do not parse, or one names a
        function that was not offered."""
        start = self.find_start(text)
        if start is None:
            return None
        parsed = self.parse_section(text[start:])
        names = set(tool_names)
        if not parsed or not parsed[0] or any(c.name not in names for c in parsed[0]):
            return None
        return start, parsed[0], parsed[1]

    def extract(self, text: str, tool_names: Iterable[str]) -> ExtractedToolCalls:
        """The calls in a whole output, or the text unchanged as content."""
        text = self.strip_eos(text)
        parsed = self.parse(text, tool_names)
        if parsed is None:
            return ExtractedToolCalls(text, [])
        start, calls, rest = parsed
        content = (text[:start] + rest).strip()
        return ExtractedToolCalls(content or None, calls)

    def held_tail(self, text: str) -> int:
        """Length of the longest tail of text that is the beginning of a marker or of the
        end-of-sequence text: a stream does not send it as content yet."""
        best = 0
        for marker in (*self.markers, *([self.eos_token] if self.eos_token else [])):
            for k in range(min(len(marker) - 1, len(text)), best, -1):
                if text.endswith(marker[:k]):
                    best = k
                    break
        return best
