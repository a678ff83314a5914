"""Greedy sampling on the device: the step's one host synchronisation is the read of
the chosen token ids (B integers), not of the [B, vocab] logits.

Only when every sequence is plain greedy (no penalties, no logprobs, no banned tokens
left by min_tokens); otherwise the caller runs the full sampler on the host.
"""

from __future__ import annotations

import torch

from ..sequence import Sequence


def plain_greedy(seq: Sequence, pending: int = 0) -> bool:
    """Is the next token an argmax of the raw logits (no penalties, logprobs, logit bias,
    grammar or min_tokens masking), with `pending` tokens sampled but not yet appended?"""
    p = seq.params
    return (
        p.is_greedy
        and p.logprobs is None
        and p.repetition_penalty == 1.0
        and not p.presence_penalty
        and not p.frequency_penalty
        and seq.num_output_tokens + pending >= p.min_tokens
        and p.structured_outputs is None  # its grammar mask and the bias apply in the sampler
        and not p.logit_bias
    )


def can_sample_greedy_on_device(logits: torch.Tensor, seqs: list[Sequence]) -> bool:
    return logits.device.type == "cuda" and logits.shape[0] == len(seqs) and all(map(plain_greedy, seqs))


def greedy_on_device(logits: torch.Tensor, seqs: list[Sequence]) -> list[int] | None:
    """Token ids, or None when some sequence needs the host sampler."""
    if not can_sample_greedy_on_device(logits, seqs):
        return None
    return logits.argmax(dim=-1).tolist()
