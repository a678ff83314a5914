"""Token counts for `inferd bench serve` without a local tokenizer of the served model.

The server's own `POST /tokenize` (vLLM's route; ours has it too) where it answers,
so the lengths are the server's; else an estimate from whitespace-separated words at
4/3 tokens a word (about what BPE tokenizers give on English). The estimate sizes the
requests and fills `total_input_tokens`; output tokens are always the server's own
count (`usage.completion_tokens`) when it streams usage.
"""

from __future__ import annotations

import logging
import math

import httpx

log = logging.getLogger(__name__)

TOKENS_PER_WORD_ESTIMATE = 4 / 3
CALIBRATION_WORDS = 256


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.split()) * TOKENS_PER_WORD_ESTIMATE)


class TokenCounter:
    def __init__(self, client: httpx.AsyncClient, url: str, model: str):
        self.client = client
        self.url = url
        self.model = model
        self.is_exact = False
        self.tokens_per_word = TOKENS_PER_WORD_ESTIMATE

    @property
    def source(self) -> str:
        return "server /tokenize" if self.is_exact else "whitespace estimate"

    async def _tokenize(self, text: str, add_special_tokens: bool) -> int | None:
        body = {"model": self.model, "prompt": text, "add_special_tokens": add_special_tokens}
        try:
            response = await self.client.post(f"{self.url}/tokenize", json=body, timeout=30)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        count = response.json().get("count")
        return count if isinstance(count, int) else None

    async def start(self, sample: str) -> None:
        """Does the server tokenize? If so, its tokens per word on `sample` (the words
        synthetic prompts are made of) size those prompts."""
        n = await self._tokenize(sample, False)
        self.is_exact = n is not None
        if n:
            self.tokens_per_word = n / max(1, len(sample.split()))
        log.info("token counts: %s (%.2f tokens a word)", self.source, self.tokens_per_word)

    async def count(self, text: str, add_special_tokens: bool = True) -> int:
        if self.is_exact:
            n = await self._tokenize(text, add_special_tokens)
            if n is not None:
                return n
        return estimate_tokens(text)
