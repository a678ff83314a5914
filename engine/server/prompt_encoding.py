"""Prompts to token ids: chat messages rendered to prompt text through the model's chat
template (chat.py), and text encoded with the tokenizer.

/v1/chat/completions and /tokenize both go through here (OpenAIServing.chat_prompt and
.encode), so a conversation tokenizes the same for either.
"""

from __future__ import annotations

import asyncio

from ..text.tokenizer import Tokenizer
from .api_models import ChatMessage
from .chat import ChatTemplateError, render_chat, template_messages
from .errors import bad_request
from .tool_parsers.tool_choice import ToolRequest

# Text prompts at least this long are tokenized in a worker thread, so that a megabyte
# prompt (about a second of tokenizing) does not hold up every other request's event loop.
TOKENIZE_IN_THREAD_CHARS = 16384


def render_chat_prompt(
    tokenizer: Tokenizer,
    messages: list[ChatMessage],
    add_generation_prompt: bool,
    tools: ToolRequest | None,
    short_ids: bool,
) -> str:
    """The messages as prompt text, through the model's chat template; a 400 naming
    messages when the template refuses them. `short_ids`: Mistral's tool call ids."""
    rendered = template_messages(messages, short_ids=short_ids)
    try:
        return render_chat(
            rendered,
            tokenizer.chat_template,
            tokenizer.bos_token,
            tokenizer.eos_token,
            add_generation_prompt,
            tools=tools.tools if tools else None,
        )
    except ChatTemplateError as exc:
        raise bad_request(str(exc), "messages") from None


async def encode_text(tokenizer: Tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    """The token ids of `text`; a long one in a worker thread, so the event loop stays free."""
    if len(text) >= TOKENIZE_IN_THREAD_CHARS:
        return await asyncio.to_thread(tokenizer.encode, text, add_special_tokens=add_special_tokens)
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)
