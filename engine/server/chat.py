"""Chat messages -> prompt text, with the checkpoint's chat template.

When tokenizer_config.json carries a `chat_template`, it is rendered with jinja2 in a
sandbox, as transformers renders it (trim_blocks, lstrip_blocks, `raise_exception`,
`messages`, `bos_token`, `eos_token`, `add_generation_prompt`). Without one, the
documented plain default below is used:

    system: You are terse.
    user: Hi
    assistant:

(one "role: content" line per message, then "assistant:" when a reply is wanted).
"""

from __future__ import annotations

from functools import lru_cache

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template refused the conversation (raise_exception) or failed to render."""


def _raise_exception(message: str):
    raise ChatTemplateError(message)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(source)


def render_chat(
    messages: list[dict],
    chat_template: str | None,
    bos_token: str | None = None,
    eos_token: str | None = None,
    add_generation_prompt: bool = True,
) -> str:
    template = _compile(chat_template or DEFAULT_CHAT_TEMPLATE)
    try:
        return template.render(
            messages=messages,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
            add_generation_prompt=add_generation_prompt,
        )
    except ChatTemplateError:
        raise
    except Exception as exc:  # the template runs on client messages: any failure is theirs to fix
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
