"""The draw: temperature, the filters (filters.py), then an exponential-noise argmax.

argmax_i(p_i / E_i) with E_i ~ Exp(1) independent is token i with probability p_i / sum p
(the race of exponential clocks of rates p_i), so the kept probabilities need no
renormalising and no sort, and the draw is one pass over the row. The noise is
counter-based (noise.py): seeded rows from (seed, output position), the others from
(engine key, draw number, slot).

A row with nothing finite to draw from (every token banned, or overflowing penalties)
degrades to the argmax of its logits instead of failing the batch.
"""

from __future__ import annotations

import torch

from . import filters, noise
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
        keep = filters.top_p_keep(probs, batch.floats[TOP_P])
    if batch.any_min_p:
        min_p = filters.min_p_keep(probs, batch.floats[MIN_P])
        keep = min_p if keep is None else keep & min_p
    return probs if keep is None else torch.where(keep, probs, 0.0)


def noise_streams(batch: SlotBatch, engine_key: int, draw_number: int) -> torch.Tensor:
    """[B] int64 stream ids: (seed, output position) for seeded rows, else (engine key
    and draw number, slot)."""
    unseeded = noise.row_streams(torch.full_like(batch.slots, engine_key), batch.slots + (draw_number << 32))
    seeded = noise.row_streams(batch.ints[SEED_KEY], batch.positions)
    return torch.where(batch.ints[IS_SEEDED] != 0, seeded, unseeded)


def draw(logits: torch.Tensor, batch: SlotBatch, streams: torch.Tensor) -> torch.Tensor:
    """[B] int64 tokens drawn from `logits` (penalised, biased, masked) per the batch's rows."""
    probs = filtered_probs(logits, batch)
    tokens = (probs / noise.exponential(streams, probs.shape[1])).argmax(dim=-1)
    bad = ~torch.isfinite(probs).all(dim=-1) | (probs.sum(dim=-1) <= 0.0)
    fallback = torch.nan_to_num(logits, nan=float("-inf")).argmax(dim=-1)
    return torch.where(bad, fallback, tokens)
