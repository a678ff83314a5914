"""How large a structured-output constraint the API accepts, checked before anything is
built from it: a 100,000-value enum, or as many guided choices, fits in a 4 MiB body yet
takes minutes of CPU and gigabytes to compile. The compile itself is bounded in time too
(compiler.py); these limits refuse the obvious cases at once, with a
400 naming the field.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any

from .params import StructuredOutputsParams


@dataclass(slots=True, frozen=True)
class StructuredOutputsLimits:
    max_values: int = 1024
    """Most enum and const values in a JSON schema, or choices in a choice list."""
    max_bytes: int = 128 << 10
    """Largest constraint text: the JSON schema, regex, grammar or the choices together."""

    def __post_init__(self) -> None:
        for name in ("max_values", "max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    @classmethod
    def from_config(cls, config: Any) -> StructuredOutputsLimits:
        """The limits an EngineConfig sets (max_grammar_values, max_grammar_bytes)."""
        return cls(config.max_grammar_values, config.max_grammar_bytes)

    def check(self, params: StructuredOutputsParams) -> None:
        """A ValueError starting with the constraint's field (structured_outputs.json, ...)
        when `params` is over a limit."""
        field = f"structured_outputs.{params.kind}"
        kind = params.kind
        if kind == "json":
            text = params.schema_text or ""
            num_values = count_schema_values(json.loads(text))
        elif kind == "choice":
            choices = params.choice or []
            text, num_values = "".join(choices), len(choices)
        elif kind in ("regex", "grammar"):
            text, num_values = str(getattr(params, kind)), 0
        else:
            return
        num_bytes = len(text.encode("utf-8", "surrogatepass"))
        if num_bytes > self.max_bytes:
            raise ValueError(f"{field} is too large: {num_bytes} bytes, at most {self.max_bytes} (max_grammar_bytes)")
        if num_values > self.max_values:
            what = "choices" if kind == "choice" else "enum and const values"
            raise ValueError(
                f"{field} has too many {what}: {num_values}, at most {self.max_values} (max_grammar_values)"
            )


def count_schema_values(schema: Any) -> int:
    """Enum and const values anywhere in a JSON schema. Breadth-first, not recursive: a
    schema may nest as deep as the JSON parser allows."""
    count = 0
    queue: deque[Any] = deque([schema])
    while queue:
        node = queue.popleft()
        if isinstance(node, dict):
            enum = node.get("enum")
            if isinstance(enum, list):
                count += len(enum)
            if "const" in node:
                count += 1
            queue.extend(v for k, v in node.items() if k not in ("enum", "const"))
        elif isinstance(node, list):
            queue.extend(node)
    return count


def remote_ref(schema: Any) -> str | None:
    """The first `$ref` in a JSON schema that does not point into the schema itself (an
    http:, https: or file: URL, or another document), else None."""
    queue: deque[Any] = deque([schema])
    while queue:
        node = queue.popleft()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and not ref.startswith("#"):
                return ref
            queue.extend(node.values())
        elif isinstance(node, list):
            queue.extend(node)
    return None
