"""Tool calling in /v1/chat/completions: the parser a request's tools need, the sampling
changes a forced call makes, and the message of a finished choice with its tool calls
parsed out. The streamed form is stream_chunks.py's; the formats are tool_parsers/.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..request.outputs import CompletionOutput
from ..request.sampling_params import SamplingParams
from ..structured_outputs.limits import StructuredOutputsLimits
from ..structured_outputs.params import StructuredOutputsParams
from ..structured_outputs.request import check_constraint
from .errors import bad_request
from .job import Job
from .tool_parsers import TOOL_PARSERS, ToolParser, make_tool_parser
from .tool_parsers.forced_json import forced_json_parser
from .tool_parsers.tool_choice import ToolRequest, check_forced_schemas, forced_call_constraint


def tool_parser_for(
    tools: ToolRequest | None, tool_call_parser: str | None, eos_token: str | None
) -> ToolParser | None:
    """The parser for the request's tools: the server's format (`tool_call_parser`), else
    vLLM's forced JSON for a forced call; None when no calls are parsed; a 400 for
    tool_choice "auto" without a format."""
    if tools is None or not tools.parses_calls:
        return None
    if tool_call_parser is not None:
        return make_tool_parser(tool_call_parser, eos_token)
    if tools.is_forced:  # vLLM's JSON, generated under structured outputs: any template will do
        return forced_json_parser(tools.choice, tools.named)
    raise bad_request(
        'tool_choice "auto" needs a tool call format: this model\'s chat template names none; '
        f"start the server with --tool-call-parser ({', '.join(sorted(TOOL_PARSERS))}), "
        'or send tool_choice "none", "required" or a named function',
        "tool_choice",
    )


def tool_params(
    params: SamplingParams, tools: ToolRequest, parser: ToolParser, limits: StructuredOutputsLimits
) -> SamplingParams:
    """`params` as the tools need them: special tokens kept for a format that marks calls
    with one, and a forced call generated under its structured output."""
    changes: dict[str, Any] = {}
    if parser.keeps_special_tokens:
        changes["skip_special_tokens"] = False  # the format's marker is a special token
    if tools.is_forced:
        if params.structured_outputs is not None:
            raise bad_request(
                "a forced tool call (tool_choice required or a named function) cannot be combined with "
                "response_format or another structured output",
                "tool_choice",
            )
        check_forced_schemas(tools, limits)
        constraint = StructuredOutputsParams(**forced_call_constraint(parser, tools))
        try:
            check_constraint(constraint, limits)
        except ValueError as exc:  # each schema compiles, but not all of them as one call
            message = str(exc).removeprefix("structured_outputs.json").lstrip(": ")
            raise bad_request(f"tools cannot constrain a forced call: {message}", "tools") from None
        changes["structured_outputs"] = constraint
    return dataclasses.replace(params, **changes) if changes else params


def chat_message(job: Job, o: CompletionOutput) -> tuple[dict[str, Any], str | None]:
    """A choice's message and finish reason, with the tool calls parsed out of its text."""
    if job.tool_parser is None or job.tools is None:
        return {"role": "assistant", "content": o.text}, o.finish_reason
    found = job.tool_parser.extract(o.text, job.tools.names)
    if not found.tool_calls:
        return {"role": "assistant", "content": found.content}, o.finish_reason
    calls = found.tool_calls if job.tools.parallel else found.tool_calls[:1]
    message = {"role": "assistant", "content": found.content, "tool_calls": [c.to_openai() for c in calls]}
    return message, "tool_calls"
