"""The tool-call formats by name (`inferd serve --tool-call-parser NAME`), and the
choice of one from a checkpoint's chat template when the option is not given."""

from __future__ import annotations

from .base import ToolParser
from .hermes import HermesToolParser
from .llama3_json import Llama3JsonToolParser
from .mistral import MistralToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (Llama3JsonToolParser, HermesToolParser, MistralToolParser)
}


def detect_tool_parser(chat_template: str | None) -> str | None:
    """The format a chat template asks its model to call tools in, or None. Each family's
    template names its own markers: Qwen 2.5 and Hermes `<tool_call>`, Mistral
    `[TOOL_CALLS]`, Llama 3.1+ `<|python_tag|>` (or a header template that lists tools)."""
    if not chat_template:
        return None
    if "<tool_call>" in chat_template:
        return "hermes"
    if "[TOOL_CALLS]" in chat_template:
        return "mistral"
    if "<|python_tag|>" in chat_template or ("<|start_header_id|>" in chat_template and "tools" in chat_template):
        return "llama3_json"
    return None


def make_tool_parser(name: str, eos_token: str | None = None) -> ToolParser:
    try:
        cls = TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"tool call parser must be one of {', '.join(sorted(TOOL_PARSERS))}; got {name!r}") from None
    return cls(eos_token)
