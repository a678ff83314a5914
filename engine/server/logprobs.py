"""Log-probabilities in OpenAI's two shapes.

The engine gives, per generated token, {token_id: logprob} holding the top-k tokens in
order and then the chosen one (when it is not among them). Token texts are the
single-token decodes (a byte-level token that is part of a character decodes to U+FFFD;
`bytes` then carries its UTF-8 bytes as OpenAI does for chat).
"""

from __future__ import annotations

from ..outputs import CompletionOutput


def _token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def completion_logprobs(tokenizer, o: CompletionOutput, start: int) -> dict:
    """/v1/completions: tokens, token_logprobs, top_logprobs, text_offset, from token `start`."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = 0
    for token_id, entry in zip(o.token_ids[start:], (o.logprobs or [])[start:]):
        text = _token_text(tokenizer, token_id)
        tokens.append(text)
        token_logprobs.append(entry.get(token_id))
        top.append({_token_text(tokenizer, t): lp for t, lp in entry.items()})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


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
