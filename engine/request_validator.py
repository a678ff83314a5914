"""Checks a request against the engine's limits without touching engine state.

The limits are plain numbers (`RequestLimits`), so the API server process can check a
request before it reaches the engine core process, with the same code the engine uses.
"""
from __future__ import annotations

from dataclasses import dataclass

from .sampling_params import SamplingParams
from .tokenizer import Tokenizer


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
            bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < lim.vocab_size]
            if bad:
                raise ValueError(f"prompt has unknown token id(s) {bad[:5]}; vocabulary is [0, {lim.vocab_size})")
        else:
            raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise ValueError("prompt is empty after tokenization")
        if len(ids) >= lim.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens; max_model_len is {lim.max_model_len} "
                             "(prompt plus at least one generated token)")
        needed = cdiv(len(ids) + 1, lim.block_size)
        if needed > lim.num_usable_blocks:
            raise ValueError(f"prompt needs {needed} KV blocks; the KV pool has {lim.num_usable_blocks}")
        bad_stop = [t for t in params.stop_token_ids if t >= lim.vocab_size]
        if bad_stop:
            raise ValueError(f"stop_token_ids has unknown token id(s) {bad_stop}")
        return ids
