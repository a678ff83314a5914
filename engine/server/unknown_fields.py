"""What the API does with request fields it does not declare: vLLM's policy, with refusals.

vLLM accepts any unknown field and ignores it, so clients built for newer OpenAI APIs
(`reasoning_effort`, `prompt_cache_key`, `safety_identifier`, `verbosity`, ...) keep
working. This server does the same, and logs each ignored field name once per process
(not once per request, which a busy gateway would turn into a log flood).

A few fields are refused instead (400, code `unsupported_parameter`): those whose value,
if dropped, would silently change what the client gets back or what the request means.
Each is refused only when it carries a non-default value (`use_beam_search: false` is
harmless), and only while this server does not declare the field: a field a request
model declares is never in `model_extra`, so supporting it later lifts the refusal.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .errors import ApiError

log = logging.getLogger(__name__)


def _set(value: Any) -> bool:
    """True for any value other than JSON's "nothing here": null, false, "", [], {}."""
    return value not in (None, False, "", [], {})


def _not_text_format(value: Any) -> bool:
    return _set(value) and not (isinstance(value, dict) and value.get("type") in (None, "text"))


def _not_text_only(value: Any) -> bool:
    return _set(value) and value != ["text"]


# name -> (is the value one that would change meaning, what it would have done)
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "use_beam_search": (_set, "beam search"),
    "prompt_embeds": (_set, "a prompt given as embeddings"),
    "prompt_logprobs": (lambda v: v is not None, "prompt logprobs"),
    "guided_json": (_set, "output constrained to a JSON schema"),
    "guided_regex": (_set, "output constrained to a regular expression"),
    "guided_choice": (_set, "output constrained to a list of choices"),
    "guided_grammar": (_set, "output constrained to a grammar"),
    "structured_outputs": (_set, "structured outputs"),
    "response_format": (_not_text_format, "a response format other than text"),
    "allowed_token_ids": (_set, "sampling restricted to given token ids"),
    "bad_words": (_set, "banned words"),
    "logits_processors": (_set, "custom logits processors"),
    "vllm_xargs": (_set, "extra arguments for custom logits processors"),
    "truncate_prompt_tokens": (lambda v: v is not None, "a truncated prompt"),
    "include_stop_str_in_output": (_set, "the stop string kept in the output"),
    "return_tokens_as_token_ids": (_set, "tokens returned as token ids"),
    "chat_template": (_set, "a chat template of the request's own"),
    "chat_template_kwargs": (_set, "chat template arguments"),
    "documents": (_set, "documents rendered into the chat template"),
    "continue_final_message": (_set, "continuing the last message instead of starting a new one"),
    "functions": (_set, "legacy function calling (send tools)"),
    "function_call": (_set, "legacy function calling (send tool_choice)"),
    "modalities": (_not_text_only, "output other than text"),
    "audio": (_set, "audio output"),
    "kv_transfer_params": (_set, "disaggregated-prefill KV transfer"),
    "cache_salt": (_set, "a prefix cache isolated by a salt"),
}

_logged: set[str] = set()
_logged_lock = threading.Lock()


def check_unknown_fields(extra: dict[str, Any] | None, where: str = "", log_as: str | None = None) -> None:
    """Refuse a field of REFUSED that carries a value; log every other unknown field
    name once per process. `where` prefixes the name in the error (`messages[2].`),
    `log_as` in the log line (`messages[].`, one line for all messages)."""
    if not extra:
        return
    for name in sorted(extra):
        rule = REFUSED.get(name)
        if rule is not None and rule[0](extra[name]):
            raise ApiError(
                400,
                f"{where}{name} is not supported by this server ({rule[1]}); leave it out",
                f"{where}{name}",
                "unsupported_parameter",
            )
    for name in sorted(extra):
        key = f"{where if log_as is None else log_as}{name}"
        with _logged_lock:
            if key in _logged:
                continue
            _logged.add(key)
        log.warning("ignoring request field %r: this server does not use it (logged once)", key)
