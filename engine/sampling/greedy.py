"""The one answer to "is this row greedy?", used by the sampler, the fast path's greedy
head and launch-ahead decoding alike.

A row is greedy when its temperature is below GREEDY_BELOW_TEMPERATURE
(SamplingParams.is_greedy). It is *plain* greedy when, besides, its token is the argmax of
the raw logits: nothing is added to them (penalties, logit bias, a grammar mask, a
min_tokens ban) and no logprobs are asked for. Only plain greedy rows may skip the sampler.
Every row without a grammar may launch ahead (runner/async_decode.py): its token needs the logits
and its slot's device state only (parameters, bias, penalty counts; sampling/slot_params.py),
and its logprobs are the raw logits' (sampling/logprobs.py), computed beside it.
"""

from __future__ import annotations

from ..request.sampling_params import SamplingParams
from ..request.sequence import Sequence


def changes_logits(params: SamplingParams) -> bool:
    """Does anything besides the filters change this request's logits before the argmax?"""
    return (
        params.repetition_penalty != 1.0
        or bool(params.presence_penalty)
        or bool(params.frequency_penalty)
        or params.structured_outputs is not None
        or bool(params.logit_bias)
    )


def can_launch_ahead(seq: Sequence) -> bool:
    """May this row's next token be chosen on the device, with nothing from the host but its
    slot's parameters and penalty counts (Sampler.draw_ahead)? Every row but one with a
    grammar, whose allowed tokens follow the host's matcher."""
    return seq.params.structured_outputs is None


def plain_greedy(seq: Sequence, pending: int = 0) -> bool:
    """Is the next token an argmax of the raw logits, with nothing to read back but the token
    (no logprobs) and `pending` tokens sampled but not yet appended (launch-ahead)?"""
    p = seq.params
    return (
        p.is_greedy and p.logprobs is None and not changes_logits(p) and seq.num_output_tokens + pending >= p.min_tokens
    )
