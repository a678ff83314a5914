"""The whole response body of a request that does not stream, and the parts streamed
chunks (stream_chunks.py) share with it: usage, the echoed prompt, prompt logprobs and a
completion choice's logprobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..request.outputs import CompletionOutput, RequestOutput
from ..text.tokenizer import Tokenizer
from .chat_tools import chat_message
from .job import Job
from .logprobs import (
    chat_logprobs,
    completion_logprobs,
    echo_logprobs,
    end_offset,
    join_completion_logprobs,
    prompt_logprobs_json,
)


def final_body(tokenizer: Tokenizer, job: Job, finals: list[RequestOutput]) -> dict:
    """The text_completion or chat.completion object of a finished job."""
    n = job.params.n
    choices = []
    for i, out in enumerate(finals):
        for o in out.outputs:
            index = i * n + o.index
            if job.chat:
                message, finish_reason = chat_message(job, o)
                choices.append(
                    {
                        "index": index,
                        "message": message,
                        "logprobs": chat_logprobs(tokenizer, o, job.top_logprobs or 0, 0)
                        if job.params.logprobs is not None
                        else None,
                        "finish_reason": finish_reason,
                        "stop_reason": o.stop_reason,
                    }
                )
            else:
                choice = {
                    "index": index,
                    "text": echo_text(tokenizer, job, i) + ("" if job.echo_only else o.text),
                    "logprobs": completion_choice_logprobs(tokenizer, job, i, out, o, 0, True)
                    if job.params.logprobs is not None
                    else None,
                    "finish_reason": "length" if job.echo_only else o.finish_reason,
                    "stop_reason": None if job.echo_only else o.stop_reason,
                }
                if job.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = prompt_logprobs(job, i, out)
                choices.append(choice)
    body: dict[str, Any] = {
        "id": job.request_id,
        "object": "chat.completion" if job.chat else "text_completion",
        "created": job.created,
        "model": job.model,
        "choices": choices,
        "usage": usage(job, finals),
    }
    if job.chat and job.prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs(job, 0, finals[0])
    return body


def usage(job: Job, outs: Sequence[RequestOutput | None]) -> dict[str, Any]:
    """The usage object of the outputs so far (None: a prompt with no output yet)."""
    prompt = sum(len(p.token_ids) for p in job.prompts)
    completion = 0
    if not job.echo_only:
        completion = sum(len(o.token_ids) for out in outs if out is not None for o in out.outputs)
    # Prompt tokens the prefix cache supplied (OpenAI's field; vLLM's with --enable-prompt-tokens-details).
    cached = sum(out.num_cached_tokens for out in outs if out is not None)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def echo_text(tokenizer: Tokenizer, job: Job, i: int) -> str:
    """Prompt i's text when the job echoes it, else ""."""
    if not job.echo:
        return ""
    text = job.prompts[i].text
    return text if isinstance(text, str) else tokenizer.decode(text, skip_special_tokens=False)


def prompt_logprobs(job: Job, i: int, out: RequestOutput) -> list | None:
    if out.prompt_logprobs is None or job.prompt_logprobs is None:
        return None
    return prompt_logprobs_json(job.prompts[i].token_ids, out.prompt_logprobs, job.prompt_logprobs)


def completion_choice_logprobs(
    tokenizer: Tokenizer,
    job: Job,
    i: int,
    out: RequestOutput | None,
    o: CompletionOutput,
    start: int,
    with_prompt: bool,
) -> dict:
    """A completion choice's logprobs from token `start`; with echo and `with_prompt`,
    the prompt's first (vLLM: prompt tokens, then the completion's)."""
    if not (job.echo and with_prompt):
        if job.echo_only:
            return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        return completion_logprobs(tokenizer, o, start)
    prompt_ids = job.prompts[i].token_ids
    lps = (out.prompt_logprobs if out is not None else None) or [None] * len(prompt_ids)
    head = echo_logprobs(tokenizer, prompt_ids, lps, job.params.logprobs or 0)
    if job.echo_only:
        return head
    return join_completion_logprobs(head, completion_logprobs(tokenizer, o, start, end_offset(head)))
