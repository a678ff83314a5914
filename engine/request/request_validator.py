"""Checks a request against the engine's limits without touching engine state.

The limits are plain numbers (`RequestLimits`), so the API server process can check a
request before it reaches the engine core process, with the same code the engine uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..text.tokenizer import Tokenizer
from .sampling_params import SamplingParams


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True, frozen=True)
class RequestLimits:
    vocab_size: int
    max_model_len: int
    block_size: int
    num_usable_blocks: int  # KV blocks a single request may hold: the pool less its watermark

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_model_len", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"RequestLimits.{name} must be >= 1, got {getattr(self, name)}")


class RequestValidator:
    def __init__(self, tokenizer: Tokenizer, limits: RequestLimits):
        self.tokenizer = tokenizer
        self.limits = limits

    def validate(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """Token ids of a valid prompt; a ValueError naming the problem otherwise."""
        lim = self.limits
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams")
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)):
            ids = list(prompt)
            if not ids:
                raise ValueError("prompt is empty")
            # C-speed checks first (a long prompt's ids are checked on every request);
            # the per-id scan runs only when they fail, to name the bad ids.
            if set(map(type, ids)) == {int} and 0 <= min(ids) and max(ids) < lim.vocab_size:
                bad = []
            else:
                bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < lim.vocab_size]
            if bad:
                raise ValueError(f"prompt has unknown token id(s) {bad[:5]}; vocabulary is [0, {lim.vocab_size})")
        else:
            raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise ValueError("prompt is empty after tokenization")
        if len(ids) >= lim.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens; max_model_len is {lim.max_model_len} "
                "(prompt plus at least one generated token)"
            )
        needed = cdiv(len(ids) + 1, lim.block_size)
        if needed > lim.num_usable_blocks:
            raise ValueError(f"prompt needs {needed} KV blocks; the KV pool has {lim.num_usable_blocks}")
        self._check_fits(len(ids), params)
        bad_stop = [t for t in params.stop_token_ids if t >= lim.vocab_size]
        if bad_stop:
            raise ValueError(
                f"stop_token_ids has unknown token id(s) {bad_stop[:5]}; vocabulary is [0, {lim.vocab_size})"
            )
        if params.logit_bias:
            bad_bias = sorted(t for t in params.logit_bias if t >= lim.vocab_size)
            if bad_bias:
                raise ValueError(
                    f"logit_bias has unknown token id(s) {bad_bias[:5]}; vocabulary is [0, {lim.vocab_size})"
                )
        return ids

    def _check_fits(self, num_prompt: int, params: SamplingParams) -> None:
        """A sequence that could outgrow the KV pool would preempt itself for ever (or,
        recomputed, block the queue), so prompt + max_tokens must fit in the blocks one
        sequence can hold. The n sequences of a request are checked one by one: they
        may share prompt blocks, and preemption lets each run alone if it must.
        A max_tokens of max_model_len or more no prompt could honour; it asks for what
        the context allows (the server's probe when a client gives no max_tokens), and
        generation stops at max_model_len, which start-up bounded by the pool."""
        lim = self.limits
        if params.max_tokens >= lim.max_model_len:
            return
        num_tokens = num_prompt + params.max_tokens
        needed = cdiv(num_tokens, lim.block_size)
        if needed > lim.num_usable_blocks:
            each = f" (each of the n={params.n} sequences must fit alone)" if params.n > 1 else ""
            raise ValueError(
                f"prompt ({num_prompt} tokens) + max_tokens ({params.max_tokens}) needs {needed} KV blocks "
                f"of {lim.block_size} tokens; the KV pool holds {lim.num_usable_blocks} for one sequence "
                f"({lim.num_usable_blocks * lim.block_size:,} tokens){each}"
            )
