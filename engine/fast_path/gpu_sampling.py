"""Greedy sampling on the device: the step's one host synchronisation is the read of
the chosen token ids (B integers), not of the [B, vocab] logits.

Only when every sequence is plain greedy (engine/sampling/greedy.py); otherwise the
caller runs the sampler (engine/sampling/sampler.py), on the device too.
"""

from __future__ import annotations

import torch

from ..request.sequence import Sequence
from ..sampling.greedy import plain_greedy

__all__ = ["can_sample_greedy_on_device"]


def can_sample_greedy_on_device(logits: torch.Tensor, seqs: list[Sequence]) -> bool:
    return logits.device.type == "cuda" and logits.shape[0] == len(seqs) and all(map(plain_greedy, seqs))
