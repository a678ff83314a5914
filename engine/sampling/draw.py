"""The draw: each row's floor (filters.py), then an exponential-noise argmax over the
tokens at or above it, in the log domain.

argmax_i p_i / E_i with E_i ~ Exp(1) independent is token i with probability p_i / sum p
(the race of exponential clocks of rates p_i). In logs that is argmax_i l_i / T - log E_i
over the kept tokens, with l the logits and T the temperature: no softmax, no
renormalising, no sort, one pass over the row. The noise is counter-based (noise.py):
seeded rows from (seed, output position), the others from (engine key, draw number, slot).

The floors: when every sampled row has a top-k of at most MAX_TOP_K_WITHIN, the filters
work on each row's k largest logits (one torch.topk); otherwise top-p runs over the whole
row: a softmax and the threshold search (filters.py; one Triton kernel on CUDA).

Greedy rows take the argmax of their logits in the same pass; so does a row with nothing
finite to draw from (every token banned, a NaN, an infinite logit), instead of failing
the batch.

On CUDA the top-p search and the noise argmax run as Triton kernels (triton_draw.py, the
same definitions) unless INFERD_TRITON_SAMPLING=0; the torch code is the CPU path.
"""

from __future__ import annotations

import torch

from . import filters, noise, triton_draw
from .slot_params import IS_GREEDY, IS_SEEDED, MIN_P, SEED_KEY, TEMPERATURE, TOP_K, TOP_P, SlotBatch, as_int64

# The largest top-k for which the filters work on the k largest logits alone: topk's cost
# grows with k, and a [B, k] sort-and-scan stays small below this.
MAX_TOP_K_WITHIN = 1024


def keep_floors(logits: torch.Tensor, batch: SlotBatch) -> torch.Tensor:
    """[B] float32: each row draws among the tokens whose logit is at least its floor
    (-inf keeps every token)."""
    temperature = batch.floats[TEMPERATURE]
    floor = torch.full_like(temperature, filters.NEG_INF)
    largest = None
    if batch.max_top_k:
        largest = torch.topk(logits, min(batch.max_top_k, logits.shape[1]), dim=-1).values
        floor = filters.top_k_floor(largest, batch.ints[TOP_K])
    if batch.any_top_p:
        if largest is not None and batch.top_k_everywhere and batch.max_top_k <= MAX_TOP_K_WITHIN:
            kth = floor
            ties_beyond = _count_at_least(logits, kth) - (largest >= kth[:, None]).sum(dim=-1)
            top_p = filters.top_p_floor_within_top_k(largest, kth, ties_beyond, temperature, batch.floats[TOP_P])
        else:
            top_p = _top_p_floor(logits, floor, batch)
        floor = torch.maximum(floor, top_p)
    if batch.any_min_p:
        max_logit = largest[:, 0] if largest is not None else logits.amax(dim=-1)
        floor = torch.maximum(floor, filters.min_p_floor(max_logit, temperature, batch.floats[MIN_P]))
    return floor


def _count_at_least(logits: torch.Tensor, floors: torch.Tensor) -> torch.Tensor:
    if triton_draw.is_enabled(logits.device):
        return triton_draw.count_at_least(logits, floors)
    return (logits >= floors[:, None]).sum(dim=-1)


def _top_p_floor(logits: torch.Tensor, top_k_floor: torch.Tensor, batch: SlotBatch) -> torch.Tensor:
    """The top-p floor over whole rows: a softmax within each row's top-k set, the
    threshold search, the smallest logit it keeps."""
    scaled = torch.where(logits >= top_k_floor[:, None], logits / batch.floats[TEMPERATURE][:, None], filters.NEG_INF)
    probs = torch.softmax(scaled, dim=-1)
    if triton_draw.is_enabled(probs.device):
        keep = probs.view(torch.int32) >= triton_draw.top_p_threshold(probs, batch.floats[TOP_P])[:, None]
    else:
        keep = filters.top_p_keep(probs, batch.floats[TOP_P])
    return filters.floor_of(keep, logits)


def noise_streams(batch: SlotBatch, engine_key: int, draw_number: int) -> torch.Tensor:
    """[B] int64 stream ids: (seed, output position) for seeded rows, else (engine key
    and draw number, slot)."""
    draw_base = as_int64(draw_number << 32)
    if triton_draw.is_enabled(batch.slots.device):
        ints = batch.ints
        return triton_draw.noise_streams(
            ints[SEED_KEY], ints[IS_SEEDED], batch.positions, batch.slots, engine_key, draw_base
        )
    unseeded = noise.row_streams(torch.full_like(batch.slots, engine_key), batch.slots + draw_base)
    seeded = noise.row_streams(batch.ints[SEED_KEY], batch.positions)
    return torch.where(batch.ints[IS_SEEDED] != 0, seeded, unseeded)


def draw(logits: torch.Tensor, batch: SlotBatch, streams: torch.Tensor) -> torch.Tensor:
    """[B] int64 tokens from float32 `logits` (penalised, biased, masked) per the batch's
    rows: greedy rows take the argmax, the others draw."""
    floors = keep_floors(logits, batch)
    temperature = batch.floats[TEMPERATURE]
    if triton_draw.is_enabled(logits.device):
        return triton_draw.draw_tokens(logits, temperature, floors, streams, batch.ints[IS_GREEDY])
    tokens = draw_reference(logits, temperature, floors, streams)
    argmax = torch.nan_to_num(logits, nan=filters.NEG_INF).argmax(dim=-1)
    return torch.where((tokens < 0) | (batch.ints[IS_GREEDY] != 0), argmax, tokens)


def draw_reference(
    logits: torch.Tensor, temperature: torch.Tensor, floors: torch.Tensor, streams: torch.Tensor
) -> torch.Tensor:
    """The draw in torch ops (the CPU path, and the kernel's definition): [B] int64, -1 for a
    row with a NaN or +inf logit or no finite logit at or above its floor."""
    kept = logits >= floors[:, None]
    scores = logits / temperature[:, None] - torch.log(noise.exponential(streams, logits.shape[1]))
    tokens = torch.where(kept, scores, filters.NEG_INF).argmax(dim=-1)
    usable = (kept & (logits > filters.NEG_INF)).any(dim=-1) & ~(torch.isnan(logits) | torch.isposinf(logits)).any(-1)
    return torch.where(usable, tokens, -1)
