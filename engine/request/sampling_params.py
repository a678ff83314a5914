"""Per-request sampling parameters, named as vLLM names them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import check_range
from ..structured_outputs.params import StructuredOutputsParams, check_logit_bias

GREEDY_BELOW_TEMPERATURE = 1e-5
"""Temperatures below this are greedy, everywhere (vLLM's threshold): dividing by them
would overflow the logits. engine/sampling/greedy.py says when a row may skip the sampler."""


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 or -1 disables top-k."""
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    """Return this many top log-probabilities per generated token (plus the chosen one)."""
    prompt_logprobs: int | None = None
    """Return this many top log-probabilities per prompt token (plus the prompt's own), as vLLM."""
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    """Constrain the output to a JSON schema, regex, choice or grammar."""
    logit_bias: dict[int, float] | None = None
    """Added to the logits of these token ids before sampling, OpenAI's range [-100, 100];
    ids against the vocabulary are checked by the request validator, which knows it."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        check_range("n", self.n, 1, 64)
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        check_range("min_tokens", self.min_tokens, 0, self.max_tokens)
        check_range("temperature", self.temperature, 0.0)
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        check_range("min_p", self.min_p, 0.0, 1.0)
        if (
            isinstance(self.repetition_penalty, bool)
            or not isinstance(self.repetition_penalty, (int, float))
            or self.repetition_penalty <= 0
        ):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if self.seed is not None:
            check_range("seed", self.seed, 0, 2**63 - 1)
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        if self.logprobs is not None:
            check_range("logprobs", self.logprobs, 0, 20)
        if self.prompt_logprobs is not None:
            if isinstance(self.prompt_logprobs, bool) or not isinstance(self.prompt_logprobs, int):
                raise ValueError(f"prompt_logprobs must be an integer in [0, 20], got {self.prompt_logprobs!r}")
            check_range("prompt_logprobs", self.prompt_logprobs, 0, 20)
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be StructuredOutputsParams, got {self.structured_outputs!r}")
        self.logit_bias = check_logit_bias(self.logit_bias) or None

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE
