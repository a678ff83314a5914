"""A streamed job's server-sent events: the chunks built from its cumulative outputs.

Text deltas hold back (a) a trailing U+FFFD, the byte-level tokenizer's partial UTF-8
character, until the next token completes it, and (b) the last len(longest stop string)
- 1 characters, which a stop string matched later would cut away. A chat stream starts
with the role; the echoed prompt and a completion's prompt logprobs go out with each
choice's first chunk, a chat's prompt logprobs once at the top level. An engine error
after the stream started is an error event, then [DONE]. The transport is streaming.py's.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from ..request.outputs import CompletionOutput, RequestOutput
from ..text.tokenizer import Tokenizer
from .core_client import EngineUnavailable, RequestFailed, RequestRejected
from .errors import error_body
from .job import ChoiceState, Job
from .logprobs import chat_logprobs
from .response_bodies import completion_choice_logprobs, echo_text, prompt_logprobs, usage
from .streaming import SSE_DONE, sse
from .tool_parsers import ToolCallStream

REPLACEMENT_CHAR = "\ufffd"


def streamable_text(text: str, finished: bool, holdback: int) -> str:
    """The part of a cumulative text that is safe to send now."""
    if finished:
        return text
    end = len(text) - holdback
    while end > 0 and text[end - 1] == REPLACEMENT_CHAR:
        end -= 1
    return text[: max(end, 0)]


async def stream_chunks(
    tokenizer: Tokenizer, job: Job, outputs: AsyncGenerator[tuple[int, RequestOutput], None]
) -> AsyncGenerator[str, None]:
    """The job's events from `outputs` ((prompt index, cumulative output) pairs), which it
    closes when done or closed itself."""
    n = job.params.n
    holdback = max((len(s) for s in job.params.stop), default=1) - 1
    latest: list[RequestOutput | None] = [None] * len(job.prompts)
    base: dict[str, Any] = {
        "id": job.request_id,
        "object": "chat.completion.chunk" if job.chat else "text_completion",
        "created": job.created,
        "model": job.model,
    }
    prompt_logprobs_sent = False
    try:
        if job.chat:
            # The role comes first, as OpenAI sends it.
            yield sse(
                base
                | {
                    "choices": [
                        {
                            "index": i * n + j,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                        for i in range(len(job.prompts))
                        for j in range(n)
                    ]
                }
            )
        async for i, out in outputs:
            latest[i] = out
            choices = []
            for o in out.outputs:
                state = job.states.setdefault((i, o.index), ChoiceState())
                if state.done:
                    continue
                choice = _delta(tokenizer, job, i * n + o.index, o, state, holdback, out, i)
                if choice is not None:
                    choices.append(choice)
            if choices:
                chunk = base | {"choices": choices}
                if job.chat and job.prompt_logprobs is not None and not prompt_logprobs_sent:
                    chunk["prompt_logprobs"] = prompt_logprobs(job, 0, out)  # chat: top level, once
                    prompt_logprobs_sent = True
                if job.include_usage and job.continuous_usage:
                    chunk["usage"] = usage(job, latest)
                yield sse(chunk)
        if job.include_usage:
            yield sse(base | {"choices": [], "usage": usage(job, latest)})
    except RequestFailed as exc:
        yield sse(error_body(500, str(exc), None, "engine_error"))
    except RequestRejected as exc:  # e.g. a grammar that did not compile in time
        yield sse(error_body(400, str(exc), None, "invalid_value"))
    except EngineUnavailable as exc:
        yield sse(error_body(503, str(exc), None, exc.reason))
    finally:
        await outputs.aclose()
    yield SSE_DONE


def _delta(
    tokenizer: Tokenizer,
    job: Job,
    index: int,
    o: CompletionOutput,
    state: ChoiceState,
    holdback: int,
    out: RequestOutput | None = None,
    prompt_index: int = 0,
) -> dict | None:
    finished = o.finish_reason is not None
    text = streamable_text(o.text, finished, holdback)
    delta_text = text[state.sent_chars :] if len(text) > state.sent_chars else ""
    new_tokens = len(o.token_ids) - state.sent_tokens
    if job.tool_parser is not None and job.tools is not None:
        return _tool_delta(tokenizer, job, index, o, state, text, new_tokens)
    if job.echo_only:
        delta_text, new_tokens = "", 0
    echo_now = job.echo and not state.started  # the prompt goes out with the choice's first chunk
    # so do its prompt logprobs (completions: in the choice, as in the whole response)
    prompt_lps_now = not job.chat and job.prompt_logprobs is not None and not state.started
    if (
        not echo_now
        and not prompt_lps_now
        and not delta_text
        and not finished
        and not (job.params.logprobs is not None and new_tokens > 0)
    ):
        return None
    logprobs = None
    if job.params.logprobs is not None:
        logprobs = (
            chat_logprobs(tokenizer, o, job.top_logprobs or 0, state.sent_tokens)
            if job.chat
            else completion_choice_logprobs(tokenizer, job, prompt_index, out, o, state.sent_tokens, echo_now)
        )
    if echo_now:
        delta_text = echo_text(tokenizer, job, prompt_index) + delta_text
    state.started = True
    state.sent_chars = max(state.sent_chars, len(text))
    state.sent_tokens = len(o.token_ids)
    state.done = finished
    if job.chat:
        delta = {"content": delta_text} if delta_text or not finished else {}
        return {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": o.finish_reason,
            "stop_reason": o.stop_reason,
        }
    choice = {
        "index": index,
        "text": delta_text,
        "logprobs": logprobs,
        "finish_reason": ("length" if job.echo_only and finished else o.finish_reason),
        "stop_reason": None if job.echo_only else o.stop_reason,
    }
    if prompt_lps_now:
        choice["prompt_logprobs"] = prompt_logprobs(job, prompt_index, out) if out is not None else None
    return choice


def _tool_delta(
    tokenizer: Tokenizer, job: Job, index: int, o: CompletionOutput, state: ChoiceState, text: str, new_tokens: int
) -> dict | None:
    assert job.tool_parser is not None and job.tools is not None
    finished = o.finish_reason is not None
    if state.tool_stream is None:
        state.tool_stream = ToolCallStream(job.tool_parser, job.tools.names, 0 if job.tools.parallel else 1)
    update = state.tool_stream.update(text, finished)
    delta: dict[str, Any] = {}
    if update.content:
        delta["content"] = update.content
    if update.tool_calls:
        delta["tool_calls"] = update.tool_calls
    if not delta and not finished and not (job.params.logprobs is not None and new_tokens > 0):
        return None
    logprobs = None
    if job.params.logprobs is not None:
        logprobs = chat_logprobs(tokenizer, o, job.top_logprobs or 0, state.sent_tokens)
    state.sent_chars = max(state.sent_chars, len(text))
    state.sent_tokens = len(o.token_ids)
    state.done = finished
    return {
        "index": index,
        "delta": delta,
        "logprobs": logprobs,
        "finish_reason": "tool_calls" if finished and update.is_tool_call else o.finish_reason,
        "stop_reason": o.stop_reason,
    }
