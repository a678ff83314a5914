"""Log-probabilities in OpenAI's two shapes, and prompt logprobs in vLLM's.

The engine gives, per generated token, {token_id: logprob} holding the top-k tokens in
order and then the chosen one (when it is not among them). Token texts are the
single-token decodes (a byte-level token that is part of a character decodes to U+FFFD;
`bytes` then carries its UTF-8 bytes as OpenAI does for chat).

Per prompt token the engine gives {token_id: Logprob(logprob, rank, decoded_token)}, the
prompt's own token first (engine/request/prompt_logprobs.py), None for the first token. `echo`
writes them ahead of the completion's in the completions shape (the first token's
`token_logprobs` and `top_logprobs` entries are null, as OpenAI's were); the
`prompt_logprobs` request field returns them as vLLM does: a list, None first, then
{token id: {logprob, rank, decoded_token}}.
"""

from __future__ import annotations

from ..request.outputs import CompletionOutput
from ..request.prompt_logprobs import PromptLogprobs


def _token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def completion_logprobs(tokenizer, o: CompletionOutput, start: int, first_offset: int = 0) -> dict:
    """/v1/completions: tokens, token_logprobs, top_logprobs, text_offset, from token
    `start`; text offsets count from `first_offset`."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = first_offset
    for token_id, entry in zip(o.token_ids[start:], (o.logprobs or [])[start:]):
        text = _token_text(tokenizer, token_id)
        tokens.append(text)
        token_logprobs.append(entry.get(token_id))
        top.append({_token_text(tokenizer, t): lp for t, lp in entry.items()})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def echo_logprobs(tokenizer, prompt_token_ids: list[int], prompt_logprobs: PromptLogprobs, top_k: int) -> dict:
    """The prompt's part of an echoed completion's logprobs (completions shape): its
    tokens, their logprobs (None for the first), the `top_k` most likely tokens of each
    position plus the prompt's own, and text offsets from 0."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = 0
    for token_id, entry in zip(prompt_token_ids, prompt_logprobs):
        own = entry.get(token_id) if entry is not None else None
        text = own.decoded_token if own is not None and own.decoded_token is not None else None
        if text is None:
            text = _token_text(tokenizer, token_id)
        tokens.append(text)
        token_logprobs.append(own.logprob if own is not None else None)
        if entry is None:
            top.append(None)
        else:
            top.append(
                {
                    (lp.decoded_token if lp.decoded_token is not None else _token_text(tokenizer, tid)): lp.logprob
                    for tid, lp in entry.items()
                    if tid == token_id or lp.rank <= top_k
                }
            )
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def join_completion_logprobs(first: dict, second: dict) -> dict:
    """Two runs of completions-shape logprobs, one after the other (`second`'s offsets
    already continue `first`'s)."""
    return {key: first[key] + second[key] for key in first}


def end_offset(logprobs: dict) -> int:
    """The text offset just past the last token of completions-shape logprobs."""
    if not logprobs["tokens"]:
        return 0
    return logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])


def prompt_logprobs_json(prompt_token_ids: list[int], prompt_logprobs: PromptLogprobs, top_k: int) -> list:
    """vLLM's `prompt_logprobs` response field: per position the prompt's token and the
    `top_k` most likely ones (the engine may hold more when echo asked for more)."""
    return [
        None
        if entry is None
        else {
            str(tid): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
            for tid, lp in entry.items()
            if tid == token_id or lp.rank <= top_k
        }
        for token_id, entry in zip(prompt_token_ids, prompt_logprobs)
    ]


def chat_logprobs(tokenizer, o: CompletionOutput, top_k: int, start: int) -> dict:
    """/v1/chat/completions: {"content": [{token, logprob, bytes, top_logprobs}]}, from token `start`."""
    content = []
    for token_id, entry in zip(o.token_ids[start:], (o.logprobs or [])[start:]):
        text = _token_text(tokenizer, token_id)
        top = []
        for tid, lp in list(entry.items())[:top_k]:
            t = _token_text(tokenizer, tid)
            top.append({"token": t, "logprob": lp, "bytes": list(t.encode())})
        content.append(
            {"token": text, "logprob": entry.get(token_id), "bytes": list(text.encode()), "top_logprobs": top}
        )
    return {"content": content}
