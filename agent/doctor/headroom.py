"""Headroom: the requests per second the node can still take at its step-time SLO.

From measured (mean batch size, mean step time) pairs, a least-squares line
t(b) = t0 + k b; the largest batch that keeps t(b) within the SLO (capped at
max_num_seqs) gives the capacity b / t(b) tokens/s, over the mean output tokens per
request, in requests/s; headroom is capacity less the current request rate. The
agent exports it (agent.collectors.headroom) and `inferd doctor` reports it.
"""

from __future__ import annotations

from dataclasses import dataclass

STEP_SUM = "inferd_scheduler_step_duration_seconds_sum"
STEP_COUNT = "inferd_scheduler_step_duration_seconds_count"
BATCH_SUM = "inferd_scheduler_batch_size_sum"
BATCH_COUNT = "inferd_scheduler_batch_size_count"
REQUESTS = "vllm:request_success_total"
GEN_SUM = "vllm:request_generation_tokens_sum"
GEN_COUNT = "vllm:request_generation_tokens_count"


@dataclass(frozen=True, slots=True)
class Headroom:
    capacity_rps: float
    headroom_rps: float
    max_batch: float
    step_at_max_s: float
    intercept_s: float
    slope_s_per_seq: float
    num_points: int


def estimate(
    points: list[tuple[float, float]],
    slo_step_s: float,
    tokens_per_request: float,
    current_rps: float,
    max_batch: float | None = None,
    min_points: int = 3,
) -> Headroom | None:
    """`points` are (mean batch size, mean step seconds); None when they are too few or
    do not vary in batch size, so no slope can be told."""
    if slo_step_s <= 0 or tokens_per_request <= 0:
        raise ValueError(f"slo_step_s and tokens_per_request must be > 0, got {slo_step_s}, {tokens_per_request}")
    usable = [(b, s) for b, s in points if b > 0 and s > 0]
    if len(usable) < min_points:
        return None
    n = len(usable)
    mean_b = sum(b for b, _ in usable) / n
    mean_s = sum(s for _, s in usable) / n
    var_b = sum((b - mean_b) ** 2 for b, _ in usable)
    if var_b <= 1e-12 * max(mean_b**2, 1.0):
        return None
    slope = sum((b - mean_b) * (s - mean_s) for b, s in usable) / var_b
    slope = max(slope, 0.0)
    intercept = mean_s - slope * mean_b
    if intercept <= 0:  # steps cost something even at batch 1: keep the line above zero
        intercept = min(s for _, s in usable) / 2
    if intercept >= slo_step_s:
        batch = 0.0
    elif slope == 0:
        batch = max_batch if max_batch else max(b for b, _ in usable)
    else:
        batch = (slo_step_s - intercept) / slope
    if max_batch:
        batch = min(batch, max_batch)
    step = intercept + slope * batch
    capacity = batch / step / tokens_per_request if batch > 0 else 0.0
    return Headroom(capacity, max(capacity - current_rps, 0.0), batch, step, intercept, slope, n)


@dataclass(frozen=True, slots=True)
class Totals:
    """The engine counters the estimate is made from, at one moment."""

    step_sum: float
    step_count: float
    batch_sum: float
    batch_count: float
    requests: float
    gen_sum: float
    gen_count: float

    @classmethod
    def from_values(cls, value) -> Totals | None:
        """From a lookup `value(name) -> float | None`; None when a series is missing."""
        names = (STEP_SUM, STEP_COUNT, BATCH_SUM, BATCH_COUNT, REQUESTS, GEN_SUM, GEN_COUNT)
        got = [value(n) for n in names]
        if any(v is None for v in got):
            return None
        return cls(*got)

    def point_since(self, earlier: Totals) -> tuple[float, float] | None:
        steps, batches = self.step_count - earlier.step_count, self.batch_count - earlier.batch_count
        if steps <= 0 or batches <= 0:
            return None
        return ((self.batch_sum - earlier.batch_sum) / batches, (self.step_sum - earlier.step_sum) / steps)
