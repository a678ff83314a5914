"""What the sampler adds to a batch's logits before its filters, each one tensor op over
the batch with per-slot state (slot_params.py), in the order of the former host sampler
(so greedy rows keep their exact values): the logit bias, the min_tokens ban, then the
repetition penalty (vLLM's: positive logits divided, negative multiplied, over prompt
and output tokens) and the presence and frequency penalties (OpenAI's, over output
tokens). The structured-outputs grammar mask goes between the bias and the ban (the
sampler applies it).
"""

from __future__ import annotations

import torch

from .slot_params import FREQUENCY, MIN_TOKENS, PRESENCE, REPETITION, SamplingSlots, SlotBatch


def add_logit_bias(logits: torch.Tensor, slots: SamplingSlots, batch: SlotBatch) -> None:
    """In place. Padding entries add 0.0 to token 0, which leaves it as it is."""
    if batch.any_bias:
        logits.scatter_add_(1, slots.bias_ids[batch.slots], slots.bias_values[batch.slots])


def ban_until_min_tokens(logits: torch.Tensor, slots: SamplingSlots, batch: SlotBatch) -> None:
    """In place: stop tokens (and EOS, unless ignored) -inf while a row is short of min_tokens."""
    if not batch.any_ban:
        return
    active = (batch.positions < batch.ints[MIN_TOKENS])[:, None] & slots.ban_valid[batch.slots]
    logits.scatter_add_(1, slots.ban_ids[batch.slots], torch.where(active, float("-inf"), 0.0))


def apply_penalties(logits: torch.Tensor, slots: SamplingSlots, batch: SlotBatch) -> torch.Tensor:
    if not batch.any_penalty:
        return logits
    assert slots.seen is not None and slots.counts is not None  # allocated when a penalty row was admitted
    repetition = batch.floats[REPETITION][:, None]
    seen = slots.seen[batch.slots] & (repetition != 1.0)
    logits = torch.where(seen, torch.where(logits > 0, logits / repetition, logits * repetition), logits)
    counts = slots.counts[batch.slots]
    terms = batch.floats[FREQUENCY][:, None] * counts.to(logits.dtype) + batch.floats[PRESENCE][:, None]
    return torch.where(counts > 0, logits - terms, logits)
