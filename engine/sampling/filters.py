"""Top-k, top-p and min-p as one number per row: the smallest logit the row may draw.

Each filter keeps every token whose probability is at least some threshold, and a
token's probability rises with its logit, so each filter's set is "logit >= floor" and
the filters together keep the tokens at or above the largest of their floors. The draw
(draw.py) then needs the floor alone, not a [B, V] mask or a softmax.

- top-k keeps the logits at or above the row's k-th largest (ties kept).
- top-p keeps the smallest set of most probable tokens (ties kept together) whose mass,
  at the row's temperature and within its top-k set, reaches p: the tokens whose
  probability is at least t*, the largest t with mass(prob >= t) >= p.
- min-p keeps the tokens whose probability is at least min_p times the row's largest:
  logit >= max logit + temperature x log(min_p).

Two ways to the top-p floor:
- `top_p_floor_within_top_k`: when a row's top-k set is small, from its k largest logits
  sorted (one torch.topk), with the ties of the k-th value beyond them counted.
- over the whole row (no top-k, or a large k): t* by bisection over the bit patterns of
  float32 probabilities in [0, 1] (a non-negative float's bits order as the float does):
  2^30 patterns, so TOP_P_STEPS = 30 halvings pin t* to one float exactly. Each step is
  one masked sum over the row; the count is fixed, so the search can be captured in a
  CUDA graph. triton_draw.py runs the same search as one kernel on CUDA. The only
  rounding is in the float32 sums (about vocab x 2^-24 of the mass), so a set whose mass
  lies that close to p may gain or lose its last token.

A row whose parameter disables a filter gets -inf from it.
"""

from __future__ import annotations

import torch

_ONE_BITS = 0x3F800000  # float32 1.0
TOP_P_STEPS = (_ONE_BITS + 1).bit_length()  # 30: halvings of [0, 1.0] down to one pattern
NEG_INF = float("-inf")


def top_k_floor(largest: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """[B]: each row's top_k-th largest logit, read from `largest` [B, K] (the row's K
    largest, descending; K at least every enabled k); -inf where top_k < 1 (off)."""
    on = top_k > 0
    k = torch.where(on, top_k, 1).clamp(max=largest.shape[1])
    kth = largest.gather(1, (k - 1)[:, None])[:, 0]
    return torch.where(on, kth, NEG_INF)


def min_p_floor(max_logit: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """[B]: prob >= min_p x max prob, as a logit: max + T log(min_p) (-inf for min_p 0)."""
    return max_logit + temperature * torch.log(min_p.to(max_logit.dtype))


def top_p_floor_within_top_k(
    largest: torch.Tensor,
    kth: torch.Tensor,
    ties_beyond: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    """[B]: the smallest logit of each row's top-p set within its top-k set. `largest`
    [B, K] descending holds the whole top-k set but for `ties_beyond` [B] more tokens
    equal to `kth` [B] (the k-th largest). -inf where top_p >= 1."""
    inside = largest >= kth[:, None]
    weights = torch.where(inside, torch.exp((largest - largest[:, :1]) / temperature[:, None]), 0.0)
    at_kth = torch.exp((kth - largest[:, 0]) / temperature) * ties_beyond
    # One scan gives every prefix mass and the total: a separate sum could add in another
    # order, and one chosen by the batch's shape (a seeded row's set must not follow it).
    prefix = weights.cumsum(dim=-1)
    total = prefix[:, -1] + at_kth
    # mass(logit >= largest[j]): the weights of the entries >= it, a prefix of the sorted row
    count_ge = largest.shape[1] - torch.searchsorted(largest.flip(-1).contiguous(), largest.contiguous())
    mass = prefix.gather(1, (count_ge - 1).clamp(min=0))
    mass = mass + torch.where(largest <= kth[:, None], at_kth[:, None], 0.0)
    enough = mass >= (top_p * total)[:, None]
    first = (inside & ~enough).sum(dim=-1)  # mass rises along the row: the first that reaches p
    floor = largest.gather(1, first.clamp(max=largest.shape[1] - 1)[:, None])[:, 0]
    return torch.where(top_p < 1.0, floor, NEG_INF)


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


def top_p_keep(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[B, V] bool: the top-p set of each row (rows with top_p >= 1 keep all)."""
    return probs.contiguous().view(torch.int32) >= top_p_threshold(probs, top_p)[:, None]


def floor_of(keep: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """[B]: the smallest logit a row keeps (+inf when it keeps none)."""
    return torch.where(keep, logits, float("inf")).amin(dim=-1)
