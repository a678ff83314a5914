"""Time-to-first-token prediction from the engine's own measured step rates.

Three exponentially weighted measures, updated from each step's `StepStats` as it closes:
tokens per second of the steps that carry prompt tokens (prefill chunks, with the
decodes batched beside them), seconds per pure decode step, and the seconds a finished
request held its seat (from its admission to its last token). A request's predicted TTFT
is the prompt tokens queued ahead of it plus its own at the prefill rate, plus, when more
sequences need a seat than there are seats, the wait for that many seats to free up:
seats short x seat time / seats (in steady state one seat frees every seat time / seats).
Nothing is assumed before something is measured: `predict` returns None before the first
prefill step, and counts no seat wait before the first request has finished, so nothing
is shed on a guess.

The same class runs in the engine core (the scheduler's slack) and in the API server
(admission), each fed the same step statistics.
"""

from __future__ import annotations

from ..stats import StepStats

DEFAULT_ALPHA = 0.2  # weight of the newest step: about the last ten steps count


class TtftPredictor:
    def __init__(self, alpha: float = DEFAULT_ALPHA):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self.alpha = alpha
        self.prefill_tokens_per_s: float | None = None
        self.decode_step_s: float | None = None
        self.seat_s: float | None = None  # a finished request's time from admission to its last token
        self.num_prefill_steps = 0
        self.num_decode_steps = 0
        self.num_finished = 0

    def _blend(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.alpha * (new - old)

    def observe(self, stats: StepStats) -> None:
        """Fold one closed step in; empty or untimed steps say nothing about rates."""
        for f in stats.finished:
            held = f.prefill_time + f.decode_time
            if held > 0.0:
                self.seat_s = self._blend(self.seat_s, held)
                self.num_finished += 1
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

    def seat_wait_seconds(self, seats_short: int, num_seats: int) -> float:
        """Seconds until `seats_short` of `num_seats` busy seats free up; 0 before any
        request has finished."""
        if seats_short <= 0 or self.seat_s is None or num_seats <= 0:
            return 0.0
        return seats_short * self.seat_s / num_seats

    def predict(
        self, num_tokens_ahead: int, num_prompt_tokens: int, seats_short: int = 0, num_seats: int = 1
    ) -> float | None:
        """Predicted seconds from now to a request's first token, behind `num_tokens_ahead`
        prompt tokens that are served before it, when `seats_short` more sequences need a
        seat (this one included) than the `num_seats` it may use have free."""
        prefill = self.prefill_seconds(num_tokens_ahead + num_prompt_tokens)
        if prefill is None:
            return None
        return prefill + self.seat_wait_seconds(seats_short, num_seats)
