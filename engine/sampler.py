"""Turns a batch of logits into next tokens, one row per sequence, on the logits' device.

Penalties follow vLLM: repetition over prompt and output tokens (divide positive
logits, multiply negative ones), presence and frequency over output tokens (OpenAI's
definition). Then temperature, top-k, top-p, min-p, and a draw. Every step is one
tensor operation over the batch with per-row parameters, so on CUDA the [B, vocab]
logits stay on the device; only the chosen token ids (and any requested logprobs)
come back. A row with a seed is drawn from its own CPU generator (its probabilities,
one row, are copied over), so its output depends on neither the batch nor the device.
Log-probabilities are those of the raw model output (as vLLM V1 returns them).

Before the penalties: `logit_bias` is added (one scatter over the batch) and a
structured-outputs row's grammar mask (engine/structured_outputs_grammar.py) sets every
token its grammar forbids to -inf, both on the logits' device.
"""

from __future__ import annotations

from typing import Any

import torch

from .device_index import device_index
from .sampling_params import SamplingParams
from .sequence import Sequence
from .structured_outputs_grammar import TokenMask

# Temperatures this small are greedy in effect, and dividing by them overflows (vLLM: 1e-5).
GREEDY_BELOW_TEMPERATURE = 1e-5


def _is_plain_greedy(seq: Sequence) -> bool:
    p = seq.params
    return (
        p.temperature < GREEDY_BELOW_TEMPERATURE
        and p.logprobs is None
        and p.repetition_penalty == 1.0
        and not p.presence_penalty
        and not p.frequency_penalty
        and seq.num_output_tokens >= p.min_tokens
        and p.structured_outputs is None
        and not p.logit_bias
    )


def _scatter_index(rows: list[int], cols: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    index = device_index(torch.tensor([rows, cols], dtype=torch.long), device)
    return index[0], index[1]


def _ban(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: list[int]) -> None:
    """Stop tokens (and EOS, unless ignored) cannot end a sequence before min_tokens."""
    rows, cols = [], []
    for i, seq in enumerate(seqs):
        p = seq.params
        if seq.num_output_tokens < p.min_tokens:
            banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))
            rows += [i] * len(banned)
            cols += banned
    if rows:
        r, c = _scatter_index(rows, cols, logits.device)
        logits[r, c] = float("-inf")


def _apply_logit_bias(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    rows: list[int] = []
    cols: list[int] = []
    bias: list[float] = []
    vocab = logits.shape[1]
    for i, seq in enumerate(seqs):
        for token, value in (seq.params.logit_bias or {}).items():
            if token < vocab:  # the validator checked ids against the model's vocabulary
                rows.append(i)
                cols.append(token)
                bias.append(value)
    if rows:
        r, c = _scatter_index(rows, cols, logits.device)
        logits.index_put_((r, c), torch.tensor(bias, dtype=logits.dtype).to(logits.device), accumulate=True)


def _apply_mask(logits: torch.Tensor, mask: TokenMask) -> None:
    import xgrammar as xgr

    xgr.apply_token_bitmask_inplace(logits, mask.bitmask, vocab_size=logits.shape[1], indices=mask.rows)


def _apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    rep_rows: list[int] = []
    rep_cols: list[int] = []
    rep_penalty: list[float] = []
    out_rows: list[int] = []
    out_cols: list[int] = []
    out_terms: list[tuple[float, float, int]] = []  # (frequency, presence, count) per output token
    for i, seq in enumerate(seqs):
        p = seq.params
        if p.repetition_penalty != 1.0:
            ids = seq.seen_token_ids()
            rep_rows += [i] * len(ids)
            rep_cols += ids
            rep_penalty += [p.repetition_penalty] * len(ids)
        if (p.presence_penalty or p.frequency_penalty) and seq.token_counts:
            out_rows += [i] * len(seq.token_counts)
            out_cols += seq.token_counts.keys()
            out_terms += [(p.frequency_penalty, p.presence_penalty, n) for n in seq.token_counts.values()]
    dev, dtype = logits.device, logits.dtype
    if rep_rows:
        r, c = _scatter_index(rep_rows, rep_cols, dev)
        penalty = torch.tensor(rep_penalty, dtype=dtype).to(dev, non_blocking=True)
        vals = logits[r, c]
        logits[r, c] = torch.where(vals > 0, vals / penalty, vals * penalty)
    if out_rows:
        r, c = _scatter_index(out_rows, out_cols, dev)
        terms = torch.tensor(out_terms, dtype=dtype).to(dev, non_blocking=True)
        logits[r, c] -= terms[:, 0] * terms[:, 2] + terms[:, 1]


def _filter(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Top-k, top-p and min-p over rows already divided by their temperature; rows
    whose parameters disable a filter are left exactly as they are."""
    num_rows, vocab = logits.shape
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in (s.params for s in seqs)]
    if min(top_k) < vocab:
        k = torch.tensor(top_k, dtype=torch.long).to(logits.device, non_blocking=True)
        kth = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    top_p = [s.params.top_p for s in seqs]
    if min(top_p) < 1.0:
        p = torch.tensor(top_p, dtype=probs.dtype).to(logits.device, non_blocking=True)[:, None]
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs > p) & (p < 1.0)  # the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
    min_p = [s.params.min_p for s in seqs]
    if max(min_p) > 0.0:
        m = torch.tensor(min_p, dtype=probs.dtype).to(logits.device, non_blocking=True)[:, None]
        logits = logits.masked_fill(probs < m * probs.max(dim=-1, keepdim=True).values, float("-inf"))
    return logits


def _draw(logits: torch.Tensor, seqs: list[Sequence], generator: torch.Generator) -> torch.Tensor:
    """One token per row of filtered logits. A row whose probabilities overflowed
    (extreme penalties) degrades to greedy instead of failing the batch."""
    probs = torch.softmax(logits, dim=-1)
    bad = ~torch.isfinite(probs).all(dim=-1) | (probs.sum(dim=-1) <= 0.0)
    fallback = torch.nan_to_num(logits, nan=float("-inf")).argmax(dim=-1)
    safe = torch.where(bad[:, None], torch.full_like(probs, 1.0), probs)
    seeded = [i for i, s in enumerate(seqs) if s.generator is not None]
    unseeded = [i for i, s in enumerate(seqs) if s.generator is None]
    tokens = torch.empty(len(seqs), dtype=torch.long, device=logits.device)
    if unseeded:
        rows = torch.tensor(unseeded, dtype=torch.long).to(logits.device, non_blocking=True)
        probs_unseeded = safe[rows] if generator.device.type == logits.device.type else safe[rows].to(generator.device)
        tokens[rows] = torch.multinomial(probs_unseeded, 1, generator=generator)[:, 0].to(logits.device)
    if seeded:
        host = safe[seeded].cpu()
        drawn = [torch.multinomial(host[j], 1, generator=seqs[i].generator) for j, i in enumerate(seeded)]
        tokens[torch.tensor(seeded, dtype=torch.long).to(logits.device)] = torch.cat(drawn).to(logits.device)
    return torch.where(bad, fallback, tokens)


class NonFiniteLogits(RuntimeError):
    """The `finite` flag handed to `sample` was false: the tokens drawn are not to be used."""


def _read(tokens: torch.Tensor, finite: torch.Tensor | None) -> list[int]:
    """Token ids to the host; a device-side finiteness flag rides on the same transfer."""
    if finite is None:
        return tokens.tolist()
    *ids, ok = torch.cat([tokens, finite.view(1).to(tokens.dtype)]).tolist()
    if not ok:
        raise NonFiniteLogits("non-finite logits")
    return ids


def sample(
    logits: torch.Tensor,
    seqs: list[Sequence],
    eos_token_ids: list[int],
    generator: torch.Generator,
    finite: torch.Tensor | None = None,
    mask: TokenMask | None = None,
) -> tuple[list[int], list[dict[int, float] | None]]:
    """Next token per row; `generator` (on the logits' device) draws for unseeded rows.
    `finite`: a 0-d bool tensor computed on the device (are the logits finite?), read
    with the tokens; when false, NonFiniteLogits is raised instead of returning.
    `mask`: the allowed tokens of the structured-outputs rows."""
    raw = logits.float()
    if mask is None and all(_is_plain_greedy(s) for s in seqs):
        return _read(raw.argmax(dim=-1), finite), [None] * len(seqs)
    logits = raw.clone()
    _apply_logit_bias(logits, seqs)
    if mask is not None:
        _apply_mask(logits, mask)
    _ban(logits, seqs, eos_token_ids)
    _apply_penalties(logits, seqs)
    greedy = [s.params.temperature < GREEDY_BELOW_TEMPERATURE for s in seqs]
    tokens = logits.argmax(dim=-1)
    if not all(greedy):
        temperature = torch.tensor(
            [1.0 if g else s.params.temperature for g, s in zip(greedy, seqs)], dtype=logits.dtype
        ).to(logits.device, non_blocking=True)
        drawn = _draw(_filter(logits / temperature[:, None], seqs), seqs, generator)
        is_greedy = torch.tensor(greedy).to(logits.device, non_blocking=True)
        tokens = torch.where(is_greedy, tokens, drawn)
    token_list = _read(tokens, finite)
    return token_list, _logprobs(raw, seqs, token_list)


def _logprobs(raw: torch.Tensor, seqs: list[Sequence], tokens: list[int]) -> list[dict[int, float] | None]:
    num_top = {i: n for i, s in enumerate(seqs) if (n := s.params.logprobs) is not None}  # row -> top-n
    wanted = list(num_top)
    out: list[dict[int, float] | None] = [None] * len(seqs)
    if not wanted:
        return out
    lp = torch.log_softmax(raw[wanted], dim=-1)
    k = max(num_top.values())
    top = torch.topk(lp, k, dim=-1) if k > 0 else None
    chosen = lp.gather(1, torch.tensor([tokens[i] for i in wanted], device=lp.device)[:, None])[:, 0].tolist()
    values = top.values.tolist() if top is not None else []  # read only for rows with n > 0, so k > 0
    indices = top.indices.tolist() if top is not None else []
    for j, i in enumerate(wanted):
        n = num_top[i]
        entry = {} if n == 0 else {idx: val for val, idx in zip(values[j][:n], indices[j][:n])}
        entry.setdefault(tokens[i], chosen[j])
        out[i] = entry
    return out


# One row per branch of `sample`: top-k, top-p and min-p with logprobs; penalties, a logit
# bias and a seeded draw; a greedy row banning EOS before min_tokens.
WARMUP_PARAMS: tuple[dict[str, Any], ...] = (
    dict(temperature=0.8, top_p=0.9, top_k=50, min_p=0.05, logprobs=2),
    dict(
        temperature=1.0,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias={0: 1.0},
        seed=0,
    ),
    dict(temperature=0.0, min_tokens=1, logprobs=0),
)


def warm_up(device: torch.device, vocab_size: int, eos_token_ids: list[int]) -> None:
    """Run `sample` once over rows that take each of its branches, on throwaway logits
    with a throwaway generator (the engine's draws are untouched). On CUDA a kernel's
    module loads on its first launch, which took up to 93 ms for a kernel of the prefill
    path on the H200 (engine/fast_path/warmup.py): the first sampled request should not
    pay that for the sampler's kernels."""
    seqs = [
        Sequence(f"sampler-warmup-{i}", 0, [1, 2, 3], SamplingParams(max_tokens=1, **params), 0, 0.0, 0)
        for i, params in enumerate(WARMUP_PARAMS)
    ]
    logits = torch.zeros(len(seqs), vocab_size, device=device)
    sample(logits, seqs, eos_token_ids, torch.Generator(device=device).manual_seed(0))
