"""Greedy sampling on the device: the step's one host synchronisation is the read of
the chosen token ids (B integers), not of the [B, vocab] logits.

Only when every sequence is plain greedy (no penalties, no logprobs, no banned tokens
left by min_tokens); otherwise the caller runs the full sampler on the host.
"""
from __future__ import annotations

import torch

from ..sequence import Sequence


def can_sample_greedy_on_device(logits: torch.Tensor, seqs: list[Sequence]) -> bool:
    if logits.device.type != "cuda" or logits.shape[0] != len(seqs):
        return False
    for seq in seqs:
        p = seq.params
        if (not p.is_greedy or p.logprobs is not None or p.repetition_penalty != 1.0
                or p.presence_penalty or p.frequency_penalty or seq.num_output_tokens < p.min_tokens):
            return False
    return True


def greedy_on_device(logits: torch.Tensor, seqs: list[Sequence]) -> list[int] | None:
    """Token ids, or None when some sequence needs the host sampler."""
    if not can_sample_greedy_on_device(logits, seqs):
        return None
    return logits.argmax(dim=-1).tolist()
