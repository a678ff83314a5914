"""Turns a batch of logits into next tokens, one row per sequence.

Penalties follow vLLM: repetition over prompt and output tokens (divide positive
logits, multiply negative ones), presence and frequency over output tokens (OpenAI's
definition). Then temperature, top-k, top-p, min-p, and a draw from the sequence's
own generator when it has a seed, so its output does not depend on the batch.
Log-probabilities are those of the raw model output (as vLLM V1 returns them).
"""
from __future__ import annotations

import torch

from .sequence import Sequence

# Temperatures this small are greedy in effect, and dividing by them overflows (vLLM: 1e-5).
GREEDY_BELOW_TEMPERATURE = 1e-5


def _apply_penalties(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    p = seq.params
    if p.repetition_penalty != 1.0:
        ids = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long)
        vals = logits[ids]
        logits[ids] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and seq.token_counts:
        ids = torch.tensor(list(seq.token_counts), dtype=torch.long)
        counts = torch.tensor(list(seq.token_counts.values()), dtype=logits.dtype)
        logits[ids] -= p.frequency_penalty * counts + p.presence_penalty
    return logits


def _filter(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    p = seq.params
    if p.top_k > 0 and p.top_k < logits.numel():
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        cumulative = sorted_probs.cumsum(0)
        drop_sorted = cumulative - sorted_probs > p.top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
    if p.min_p > 0.0:
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return logits


def sample(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: list[int],
           generator: torch.Generator) -> tuple[list[int], list[dict[int, float] | None]]:
    logits = logits.float().cpu()
    tokens: list[int] = []
    logprobs: list[dict[int, float] | None] = []
    for row, seq in zip(logits, seqs):
        p = seq.params
        raw = row
        row = row.clone()
        if seq.num_output_tokens < p.min_tokens:
            banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))
            if banned:
                row[torch.tensor(banned, dtype=torch.long)] = float("-inf")
        row = _apply_penalties(row, seq)
        if p.temperature < GREEDY_BELOW_TEMPERATURE:
            token = int(row.argmax())
        else:
            row = _filter(row / p.temperature, seq)
            probs = torch.softmax(row, dim=-1)
            if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0.0:
                # Extreme penalties can overflow a row; degrade this sequence to greedy
                # rather than fail the whole batch in multinomial.
                token = int(torch.nan_to_num(row, nan=float("-inf")).argmax())
            else:
                token = int(torch.multinomial(probs, 1, generator=seq.generator or generator))
        tokens.append(token)
        if p.logprobs is not None:
            lp = torch.log_softmax(raw, dim=-1)
            top = torch.topk(lp, p.logprobs) if p.logprobs > 0 else None
            entry = {} if top is None else {int(i): float(v) for v, i in zip(top.values, top.indices)}
            entry.setdefault(token, float(lp[token]))
            logprobs.append(entry)
        else:
            logprobs.append(None)
    return tokens, logprobs
