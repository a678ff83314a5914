"""The draw: temperature, the filters (filters.py), then an exponential-noise argmax.

argmax_i(p_i / E_i) with E_i ~ Exp(1) independent is token i with probability p_i / sum p
(the race of exponential clocks of rates p_i), so the kept probabilities need no
renormalising and no sort, and the draw is one pass over the row. The noise is
counter-based (noise.py): seeded rows from (seed, output position), the others from
(engine key, draw number, slot).

A row with nothing finite to draw from (every token banned, or overflowing penalties)
degrades to the argmax of its logits instead of failing the batch.

On CUDA the top-p threshold and the noise argmax run as Triton kernels (triton_draw.py,
the same definitions) unless INFERD_TRITON_SAMPLING=0; the torch code is the CPU path.
"""

from __future__ import annotations

import torch

from . import filters, noise, triton_draw
from .slot_params import IS_SEEDED, MIN_P, SEED_KEY, TEMPERATURE, TOP_K, TOP_P, SlotBatch


def filtered_probs(logits: torch.Tensor, batch: SlotBatch) -> torch.Tensor:
    """[B, V] float32: each row's softmax at its temperature, zero outside its top-k,
    top-p and min-p sets (not renormalised)."""
    scaled = logits / batch.floats[TEMPERATURE][:, None]
    if batch.max_top_k:
        scaled = scaled.masked_fill(~filters.top_k_keep(scaled, batch.ints[TOP_K], batch.max_top_k), float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    keep = None
    if batch.any_top_p:
        keep = _top_p_keep(probs, batch.floats[TOP_P])
    if batch.any_min_p:
        min_p = filters.min_p_keep(probs, batch.floats[MIN_P])
        keep = min_p if keep is None else keep & min_p
    return probs if keep is None else torch.where(keep, probs, 0.0)


# The kernel's search runs one program per row: at batch 1 one SM walks the whole vocabulary
# 8 times, and the torch bisection (each step spread over the GPU) was faster on the H100
# (top_p 0.9 at batch 1: 145.7 against 107.4 tok/s); at 256 rows the kernel was (7,594
# against 6,302). Fewer rows take the torch search 16 thresholds a pass (fewer launches).
# Between the two measured ends the switch-over row count is a guess.
MIN_ROWS_FOR_TOP_P_KERNEL = 16


def _top_p_keep(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    if not triton_draw.is_enabled(probs.device):
        return filters.top_p_keep(probs, top_p)
    if probs.shape[0] < MIN_ROWS_FOR_TOP_P_KERNEL:
        threshold = filters.top_p_threshold_fanout(probs, top_p)
    else:
        threshold = triton_draw.top_p_threshold(probs, top_p)
    return probs.contiguous().view(torch.int32) >= threshold[:, None]


def noise_streams(batch: SlotBatch, engine_key: int, draw_number: int) -> torch.Tensor:
    """[B] int64 stream ids: (seed, output position) for seeded rows, else (engine key
    and draw number, slot)."""
    unseeded = noise.row_streams(torch.full_like(batch.slots, engine_key), batch.slots + (draw_number << 32))
    seeded = noise.row_streams(batch.ints[SEED_KEY], batch.positions)
    return torch.where(batch.ints[IS_SEEDED] != 0, seeded, unseeded)


def draw(logits: torch.Tensor, batch: SlotBatch, streams: torch.Tensor) -> torch.Tensor:
    """[B] int64 tokens drawn from `logits` (penalised, biased, masked) per the batch's rows."""
    probs = filtered_probs(logits, batch)
    fallback = torch.nan_to_num(logits, nan=float("-inf")).argmax(dim=-1)
    if triton_draw.is_enabled(probs.device):
        tokens = triton_draw.draw_tokens(probs, streams)  # -1: nothing to draw from
        return torch.where(tokens < 0, fallback, tokens)
    tokens = (probs / noise.exponential(streams, probs.shape[1])).argmax(dim=-1)
    bad = ~torch.isfinite(probs).all(dim=-1) | (probs.sum(dim=-1) <= 0.0)
    return torch.where(bad, fallback, tokens)
