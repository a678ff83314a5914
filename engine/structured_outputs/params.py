"""What a request's output must match: a JSON schema, any JSON object, a regex, one of a
list of strings, or an EBNF grammar (vLLM's `StructuredOutputsParams`).

`before`/`after` are literal text around a JSON schema, so a tool call's wrapper
(`<tool_call>{...}</tool_call>`) is part of the constraint and the model cannot leave it.
"""

from __future__ import annotations

import json as _json
from dataclasses import dataclass
from typing import Any

_KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(slots=True, frozen=True)
class StructuredOutputsParams:
    json: dict[str, Any] | str | None = None
    """A JSON schema, as a dict or its JSON text."""
    json_object: bool = False
    """Any JSON object."""
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    """EBNF (GBNF) text with a `root` rule."""
    before: str = ""
    after: str = ""

    def __post_init__(self) -> None:
        set_kinds = [k for k in _KINDS if self._is_set(k)]
        if len(set_kinds) != 1:
            shown = ", ".join(set_kinds) if set_kinds else "none"
            raise ValueError(f"structured_outputs needs exactly one of {', '.join(_KINDS)}; got {shown}")
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    parsed = _json.loads(self.json)
                except ValueError as e:
                    raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
                if not isinstance(parsed, (dict, bool)):
                    raise ValueError("structured_outputs.json must be a JSON schema object")
            elif not isinstance(self.json, dict):
                raise ValueError(f"structured_outputs.json must be a schema object or its JSON text, got {self.json!r}")
        if not isinstance(self.json_object, bool):
            raise ValueError(f"structured_outputs.json_object must be a boolean, got {self.json_object!r}")
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            raise ValueError(f"structured_outputs.regex must be a non-empty string, got {self.regex!r}")
        if self.choice is not None:
            if (
                not isinstance(self.choice, list)
                or not self.choice
                or not all(isinstance(c, str) and c for c in self.choice)
            ):
                raise ValueError(
                    f"structured_outputs.choice must be a non-empty list of non-empty strings, got {self.choice!r}"
                )
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError(f"structured_outputs.grammar must be non-empty EBNF text, got {self.grammar!r}")
        for name in ("before", "after"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"structured_outputs.{name} must be a string")
        if (self.before or self.after) and self.json is None:
            raise ValueError("structured_outputs.before/after apply to a json schema only")

    def _is_set(self, kind: str) -> bool:
        value = getattr(self, kind)
        return value is not False and value is not None

    @property
    def kind(self) -> str:
        return next(k for k in _KINDS if self._is_set(k))

    @property
    def schema_text(self) -> str | None:
        """The JSON schema as canonical text (the grammar cache key), or None."""
        if self.json is None:
            return None
        value = _json.loads(self.json) if isinstance(self.json, str) else self.json
        return _json.dumps(value, separators=(",", ":"))  # property order is output order

    @property
    def cache_key(self) -> tuple[str, str, str, str]:
        """Two requests with equal keys share one compiled grammar."""
        kind = self.kind
        if kind == "json":
            body = self.schema_text or ""
        elif kind == "json_object":
            body = ""
        elif kind == "choice":
            body = _json.dumps(self.choice)
        else:
            body = str(getattr(self, kind))
        return (kind, body, self.before, self.after)


def check_logit_bias(logit_bias: Any, vocab_size: int | None = None) -> dict[int, float] | None:
    """Validate a token-id -> bias map (OpenAI's range [-100, 100]); keys may be id strings."""
    if logit_bias is None:
        return None
    if not isinstance(logit_bias, dict):
        raise ValueError(f"logit_bias must be a map of token id to bias, got {logit_bias!r}")
    out: dict[int, float] = {}
    for key, bias in logit_bias.items():
        if isinstance(key, bool):
            raise ValueError(f"logit_bias key {key!r} is not a token id")
        try:
            token_id = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias key {key!r} is not a token id") from None
        if isinstance(key, float) or token_id < 0 or (vocab_size is not None and token_id >= vocab_size):
            bound = f" in [0, {vocab_size})" if vocab_size is not None else " >= 0"
            raise ValueError(f"logit_bias key {key!r} must be a token id{bound}")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100.0 <= bias <= 100.0:
            raise ValueError(f"logit_bias value for token {key!r} must be a number in [-100, 100], got {bias!r}")
        out[token_id] = float(bias)
    return out
