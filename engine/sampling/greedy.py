"""The one answer to "is this row greedy?", used by the sampler, the fast path's greedy
head and launch-ahead decoding alike.

A row is greedy when its temperature is below GREEDY_BELOW_TEMPERATURE
(SamplingParams.is_greedy). It is *plain* greedy when, besides, its token is the argmax of
the raw logits: nothing is added to them (penalties, logit bias, a grammar mask, a
min_tokens ban) and no logprobs are asked for. Only plain greedy rows may skip the sampler.
Rows that draw from their raw logits (greedy or not, asking for logprobs or not) may launch
ahead (async_decode.py): their tokens need the logits and the slot's parameters only, and
their logprobs are the raw logits' (sampling/logprobs.py), computed on the device beside them.
"""

from __future__ import annotations

from ..sampling_params import SamplingParams
from ..sequence import Sequence


def changes_logits(params: SamplingParams) -> bool:
    """Does anything besides the filters change this request's logits before the argmax?"""
    return (
        params.repetition_penalty != 1.0
        or bool(params.presence_penalty)
        or bool(params.frequency_penalty)
        or params.structured_outputs is not None
        or bool(params.logit_bias)
    )


def draws_from_raw_logits(seq: Sequence, pending: int = 0) -> bool:
    """Is the next token chosen from the raw logits alone (argmax, or a draw at its
    temperature through its filters), with `pending` tokens drawn but not yet appended?
    Such rows may launch ahead, logprobs and all (those are of the raw logits too)."""
    p = seq.params
    return not changes_logits(p) and seq.num_output_tokens + pending >= p.min_tokens


def plain_greedy(seq: Sequence, pending: int = 0) -> bool:
    """Is the next token an argmax of the raw logits, with nothing to read back but the token
    (no logprobs) and `pending` tokens sampled but not yet appended (launch-ahead)?"""
    return seq.params.is_greedy and seq.params.logprobs is None and draws_from_raw_logits(seq, pending)
