"""Tool calling: the formats models write calls in, and the request side of `tools`."""

from .base import ExtractedToolCalls, PartialCall, ToolCall, ToolParser
from .registry import TOOL_PARSERS, detect_tool_parser, make_tool_parser
from .stream import StreamDelta, ToolCallStream

__all__ = [
    "TOOL_PARSERS",
    "ExtractedToolCalls",
    "PartialCall",
    "StreamDelta",
    "ToolCall",
    "ToolCallStream",
    "ToolParser",
    "detect_tool_parser",
    "make_tool_parser",
]
