"""The request side of tool calling: `tools`, `tool_choice` and `parallel_tool_calls`
checked into a `ToolRequest`, and the constraint a forced call is generated under.

tool_choice (OpenAI's meaning): "none" never parses calls; "auto" (the default with tools)
parses the calls the model writes; "required" and {"type": "function", "function":
{"name": ...}} force a call: the output is generated under a JSON schema of one call in
the model's own format (the format's text before and after the JSON, a `name` constant
and the tool's parameters), so it always parses. A model with no format gets vLLM's
(forced_json.py): a JSON array of calls, or the named function's arguments alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...structured_outputs.limits import StructuredOutputsLimits
from ...structured_outputs.params import StructuredOutputsParams
from ...structured_outputs.request import check_constraint
from ..errors import bad_request
from .base import ToolParser

FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
CHOICES = ("none", "auto", "required")


@dataclass(slots=True)
class ToolRequest:
    tools: list[dict[str, Any]]
    choice: str
    """none, auto, required or named."""
    named: str | None = None
    parallel: bool = True

    def __post_init__(self) -> None:
        if self.choice not in (*CHOICES, "named"):
            raise ValueError(f"choice must be one of none, auto, required, named; got {self.choice!r}")
        if (self.choice == "named") != (self.named is not None):
            raise ValueError("a named choice needs the function's name, and only it")

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def is_forced(self) -> bool:
        return self.choice in ("required", "named")

    @property
    def parses_calls(self) -> bool:
        return self.choice != "none"

    def forced_tools(self) -> list[dict[str, Any]]:
        return [t for t in self.tools if self.named is None or t["function"]["name"] == self.named]


def _check_tool(tool: Any, i: int) -> None:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise bad_request(f'{where}.type must be "function"', f"{where}.type")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise bad_request(f"{where}.function must be an object", f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise bad_request(
            f"{where}.function.name must be 1-64 letters, digits, underscores or dashes; got {name!r}",
            f"{where}.function.name",
        )
    if "description" in function and not isinstance(function["description"], (str, type(None))):
        raise bad_request(f"{where}.function.description must be a string", f"{where}.function.description")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise bad_request(f"{where}.function.parameters must be a JSON schema object", f"{where}.function.parameters")
    if "strict" in function and not isinstance(function["strict"], (bool, type(None))):
        raise bad_request(f"{where}.function.strict must be a boolean", f"{where}.function.strict")


def tool_request(tools: list[Any] | None, tool_choice: Any, parallel_tool_calls: bool | None) -> ToolRequest | None:
    """The checked tool fields of a chat request; None when it has no tools (and asks none)."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise bad_request("tool_choice is only allowed when tools are specified", "tool_choice")
        return None
    for i, tool in enumerate(tools):
        _check_tool(tool, i)
    names = [t["function"]["name"] for t in tools]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise bad_request(f"tools: the function name {duplicate!r} is given more than once", "tools")
    parallel = True if parallel_tool_calls is None else parallel_tool_calls
    if tool_choice is None or tool_choice in CHOICES:
        return ToolRequest(list(tools), tool_choice or "auto", parallel=parallel)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise bad_request("tool_choice.function.name must be a string", "tool_choice.function.name")
        if name not in names:
            raise bad_request(
                f"tool_choice names the function {name!r}, which is not among tools ({', '.join(names)})",
                "tool_choice.function.name",
            )
        return ToolRequest(list(tools), "named", named=name, parallel=parallel)
    raise bad_request(
        'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}; '
        f"got {tool_choice!r}",
        "tool_choice",
    )


def check_forced_schemas(request: ToolRequest, limits: StructuredOutputsLimits) -> None:
    """A forced call is generated under its tools' parameters schemas: each must compile
    (within the limits), or the request is a 400 naming the tool's parameters."""
    for i, tool in enumerate(request.tools):
        function = tool["function"]
        parameters = function.get("parameters")
        if parameters is None or (request.named is not None and function["name"] != request.named):
            continue
        try:
            check_constraint(StructuredOutputsParams(json=parameters), limits)
        except ValueError as exc:
            where = f"tools[{i}].function.parameters"
            message = str(exc).removeprefix("structured_outputs.json").lstrip(": ")
            raise bad_request(f"{where} cannot constrain a forced call: {message}", where) from None


def forced_call_constraint(parser: ToolParser, request: ToolRequest) -> dict[str, Any]:
    """Keyword arguments of StructuredOutputsParams for a forced call in `parser`'s format;
    a 400 naming `tools` when their schemas cannot be joined into one."""
    try:
        schema = parser.forced_schema(request.forced_tools(), request.parallel)
    except ValueError as exc:
        raise bad_request(f"tools cannot constrain a forced call: {exc}", "tools") from None
    return {"json": schema, "before": parser.call_before, "after": parser.call_after}
