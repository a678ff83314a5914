"""Chat messages -> prompt text, with the checkpoint's chat template.

When tokenizer_config.json carries a `chat_template`, it is rendered with jinja2 in a
sandbox, as transformers renders it (trim_blocks, lstrip_blocks, `raise_exception`,
`messages`, `bos_token`, `eos_token`, `add_generation_prompt`). Without one, the
documented plain default below is used:

    system: You are terse.
    user: Hi
    assistant:

(one "role: content" line per message, then "assistant:" when a reply is wanted; an
assistant's tool calls follow its content as JSON).

Messages reach the template as transformers hands them over: `role`, `content` (a string,
or None for an assistant message that only calls tools; text parts are joined), and, where
the client sent them, `name`, `tool_calls` (with each call's `function.arguments` decoded
from its JSON string into an object, as templates write it back with `tojson`) and
`tool_call_id`; the tool definitions arrive as `tools` (None without tools).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import bad_request

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] or '' }}"
    "{% if message['tool_calls'] %}{{ message['tool_calls'] | tojson }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
# Mistral's templates refuse tool call ids other than 9 alphanumerics; vLLM keeps the last 9.
MISTRAL_ID_CHARS = 9


class ChatTemplateError(ValueError):
    """The template refused the conversation (raise_exception) or failed to render."""


def _raise_exception(message: str):
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    # transformers' filter: plain json.dumps, without jinja's HTML escaping of <, > and &.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def _tool_calls(calls: list[dict[str, Any]], where: str, short_ids: bool) -> list[dict[str, Any]]:
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request(f"{at}.function.name must be a string", f"{at}.function.name")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                raise bad_request(
                    f"{at}.function.arguments is not valid JSON: {exc}", f"{at}.function.arguments"
                ) from None
        if not isinstance(arguments, dict):
            raise bad_request(f"{at}.function.arguments must be a JSON object", f"{at}.function.arguments")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise bad_request(f"{at}.id must be a string", f"{at}.id")
        entry: dict[str, Any] = {
            "type": call.get("type", "function"),
            "function": {"name": function["name"], "arguments": arguments},
        }
        if call_id is not None:
            entry["id"] = call_id[-MISTRAL_ID_CHARS:] if short_ids else call_id
        out.append(entry)
    return out


def template_messages(messages: list, short_ids: bool = False) -> list[dict[str, Any]]:
    """The request's messages (api_models.ChatMessage) as the chat template reads them.
    `short_ids` keeps the last 9 characters of tool call ids, for Mistral's templates."""
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        entry: dict[str, Any] = {"role": m.role}
        if m.tool_calls:
            if m.role != "assistant":
                raise bad_request(f"{where}.tool_calls is only allowed on assistant messages", f"{where}.tool_calls")
            entry["content"] = m.text(i) if m.content is not None else None
            entry["tool_calls"] = _tool_calls(m.tool_calls, where, short_ids)
        else:
            entry["content"] = m.text(i)
        if m.name:
            entry["name"] = m.name
        if m.role == "tool":
            if not m.tool_call_id:
                raise bad_request(f"{where}.tool_call_id is required for tool messages", f"{where}.tool_call_id")
            entry["tool_call_id"] = m.tool_call_id[-MISTRAL_ID_CHARS:] if short_ids else m.tool_call_id
        out.append(entry)
    return out


def render_chat(
    messages: list[dict],
    chat_template: str | None,
    bos_token: str | None = None,
    eos_token: str | None = None,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    template = _compile(chat_template or DEFAULT_CHAT_TEMPLATE)
    try:
        return template.render(
            messages=messages,
            tools=tools or None,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
            add_generation_prompt=add_generation_prompt,
        )
    except ChatTemplateError:
        raise
    except Exception as exc:  # the template runs on client messages: any failure is theirs to fix
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
