"""Top-k, top-p and min-p as a per-row keep mask, without a full sort.

- top-k keeps the logits at or above the row's k-th largest (ties kept): one torch.topk
  over the batch's largest k.
- top-p keeps the smallest set of most probable tokens (ties kept together) whose mass
  reaches p: the tokens whose probability is at least t*, the largest t with
  mass(prob >= t) >= p. t* is found by bisection over the bit patterns of float32
  probabilities in [0, 1] (a non-negative float's bits order as the float does): 2^30
  patterns, so TOP_P_STEPS = 30 halvings pin t* to one float exactly. Each step is one
  masked sum over the row; the count is fixed, so the search can be captured in a CUDA
  graph. The only rounding is in those float32 sums (about vocab x 2^-24 of the mass), so
  a set whose mass lies that close to p may gain or lose its last token.
- min-p keeps the tokens whose probability is at least min_p times the row's largest.

A row whose parameter disables a filter keeps every token for it.
"""

from __future__ import annotations

import torch

_ONE_BITS = 0x3F800000  # float32 1.0
TOP_P_STEPS = (_ONE_BITS + 1).bit_length()  # 30: halvings of [0, 1.0] down to one pattern


def top_k_keep(logits: torch.Tensor, top_k: torch.Tensor, max_k: int) -> torch.Tensor:
    """[B, V] bool: logits at or above each row's top_k-th largest; `top_k` [B] int64 with
    values >= V (or < 1) meaning off; `max_k`: at least every enabled row's k."""
    vocab = logits.shape[1]
    on = (top_k > 0) & (top_k < vocab)
    k = torch.where(on, top_k, 1).clamp(max=max_k)
    kth = torch.topk(logits, min(max_k, vocab), dim=-1).values.gather(1, (k - 1)[:, None])
    return (logits >= kth) | ~on[:, None]


def top_p_threshold(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[B] int32: the bit pattern of each row's t* (module doc); 0 keeps every token."""
    bits = probs.contiguous().view(torch.int32)
    lo = torch.zeros(probs.shape[0], dtype=torch.int32, device=probs.device)  # mass(>= lo) >= p holds
    hi = torch.full_like(lo, _ONE_BITS + 1)  # mass(>= hi) >= p fails (top_p > 0)
    p = top_p.to(probs.dtype)
    zero = probs.new_zeros(())
    for _ in range(TOP_P_STEPS):
        mid = lo + (hi - lo) // 2
        mass = torch.where(bits >= mid[:, None], probs, zero).sum(dim=-1)
        ok = mass >= p
        lo = torch.where(ok, mid, lo)
        hi = torch.where(ok, hi, mid)
    return torch.where(p < 1.0, lo, 0)


TOP_P_FAN = 16  # thresholds tried per pass by the fan-out search
TOP_P_FAN_PASSES = 8  # 16^8 > 0x3F800001: eight 16-fold narrowings pin one pattern


def top_p_threshold_fanout(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """top_p_threshold found 16 candidates at a time: 8 passes over [B, 16, V] instead of 30
    over [B, V]. The same definition; fewer, larger launches, which is what a GPU step of a
    few rows pays for (the bisection's 30 rounds are ~200 small kernels). Memory: 16x the
    probabilities, so for few rows only."""
    bits = probs.contiguous().view(torch.int32)
    rows = probs.shape[0]
    lo = torch.zeros(rows, dtype=torch.int64, device=probs.device)  # mass(>= lo) >= p holds
    hi = torch.full_like(lo, _ONE_BITS + 1)  # mass(>= hi) >= p fails
    fan = torch.arange(TOP_P_FAN, dtype=torch.int64, device=probs.device)
    p = top_p.to(probs.dtype)
    for _ in range(TOP_P_FAN_PASSES):
        step = (hi - lo + TOP_P_FAN - 1) // TOP_P_FAN
        candidates = lo[:, None] + fan[None, :] * step[:, None]  # [B, FAN], the first is lo
        above = bits[:, None, :] >= candidates.to(torch.int32)[:, :, None]
        mass = torch.where(above, probs[:, None, :], 0.0).sum(dim=-1)
        ok = (mass >= p[:, None]) & (candidates < hi[:, None])
        last = (ok * fan[None, :]).amax(dim=-1)  # the largest candidate that still holds p
        lo = lo + last * step
        hi = torch.minimum(hi, lo + step)
    return torch.where(p < 1.0, lo, 0).to(torch.int32)


def top_p_keep(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[B, V] bool: the top-p set of each row (rows with top_p >= 1 keep all)."""
    return probs.contiguous().view(torch.int32) >= top_p_threshold(probs, top_p)[:, None]


def min_p_keep(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """[B, V] bool: probabilities at least min_p x the row's largest (min_p 0 keeps all)."""
    return probs >= min_p.to(probs.dtype)[:, None] * probs.max(dim=-1, keepdim=True).values
