"""Time-to-first-token prediction from the engine's own measured step rates.

Two exponentially weighted rates, updated from each step's `StepStats` as it closes:
tokens per second of the steps that carry prompt tokens (prefill chunks, with the
decodes batched beside them), and seconds per pure decode step. A request's predicted
TTFT is the prompt tokens queued ahead of it plus its own, at the prefill rate: the
scheduler spends each step's token budget on prompts in that order, so the backlog
drains at what prefill steps have been achieving. Nothing is assumed before the first
prefill step is measured: `predict` returns None and nothing is shed on a guess.

The same class runs in the engine core (the scheduler's slack) and in the API server
(admission), each fed the same step statistics.
"""

from __future__ import annotations

from .stats import StepStats

DEFAULT_ALPHA = 0.2  # weight of the newest step: about the last ten steps count


class TtftPredictor:
    def __init__(self, alpha: float = DEFAULT_ALPHA):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self.alpha = alpha
        self.prefill_tokens_per_s: float | None = None
        self.decode_step_s: float | None = None
        self.num_prefill_steps = 0
        self.num_decode_steps = 0

    def _blend(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.alpha * (new - old)

    def observe(self, stats: StepStats) -> None:
        """Fold one closed step in; empty or untimed steps say nothing about rates."""
        if stats.batch_size == 0 or stats.duration <= 0.0:
            return
        if stats.num_batched_tokens > stats.batch_size:  # prompt tokens in the step
            self.prefill_tokens_per_s = self._blend(
                self.prefill_tokens_per_s, stats.num_batched_tokens / stats.duration
            )
            self.num_prefill_steps += 1
        else:
            self.decode_step_s = self._blend(self.decode_step_s, stats.duration)
            self.num_decode_steps += 1

    def prefill_seconds(self, num_tokens: int) -> float | None:
        """Seconds to compute `num_tokens` prompt tokens at the measured rate; None before any."""
        if self.prefill_tokens_per_s is None:
            return None
        return num_tokens / self.prefill_tokens_per_s

    def predict(self, num_tokens_ahead: int, num_prompt_tokens: int) -> float | None:
        """Predicted seconds from now to a request's first token, behind `num_tokens_ahead`
        prompt tokens that are served before it."""
        return self.prefill_seconds(num_tokens_ahead + num_prompt_tokens)
