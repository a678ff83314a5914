"""What a level of `inferd bench serve` is judged on: per request, did it meet every
target of its class; per level and per class, goodput and latency.

Definitions (vLLM's `vllm bench serve` where it has one, and its JSON key names):
- completed: HTTP 200 and a stream that carried at least one token without an error.
- shed: refused with HTTP 429 or 503 (the server said "not now"); counted apart from
  failed (any other outcome), with how fast the refusal came.
- TTFT: send to the first streamed chunk carrying a choice. ITL: between such chunks.
- TPOT = (e2e - TTFT) / (output tokens - 1); a one-token reply has none, and like vLLM
  we count its TPOT target as met.
- goodput (`request_goodput`): completed requests that met every target of their class,
  per second of the level's wall time; a best-effort class's completed requests count.
  None when no class has a target (vLLM reports None without --goodput).
- attainment: those good requests over all sent; `attainment_of_admitted`: over those
  not shed, so a server that sheds early to keep its promises shows it.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .slo_classes import SloClass

SHED_STATUSES = (429, 503)
PERCENTILES = (90, 99)


@dataclass(slots=True)
class RequestRecord:
    slo_class: str
    prompt_len: int = 0
    status: int = 0  # HTTP status; 0 when no response came
    ttft: float = math.nan
    itls: list[float] = field(default_factory=list)
    e2e: float = math.nan  # send to the end of the stream, or to the refusal or failure
    num_output_tokens: int = 0
    error: str = ""

    @property
    def is_shed(self) -> bool:
        return self.status in SHED_STATUSES

    @property
    def is_completed(self) -> bool:
        return self.status == 200 and not self.error and not math.isnan(self.ttft)

    @property
    def tpot(self) -> float | None:
        if not self.is_completed or self.num_output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.num_output_tokens - 1)


def meets(record: RequestRecord, slo: SloClass) -> bool:
    """Completed, and within every target its class sets."""
    if not record.is_completed:
        return False
    tpot = record.tpot
    return (
        (slo.ttft_s is None or record.ttft <= slo.ttft_s)
        and (slo.tpot_s is None or tpot is None or tpot <= slo.tpot_s)
        and (slo.e2e_s is None or record.e2e <= slo.e2e_s)
    )


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100], numpy's default); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_stats(name: str, seconds: Sequence[float]) -> dict[str, float | None]:
    """`mean_<name>_ms`, `median_`, `std_`, `p90_`, `p99_` (vLLM's keys); None for no values."""
    if not seconds:
        return {f"{k}_{name}_ms": None for k in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES))}
    out: dict[str, float | None] = {
        f"mean_{name}_ms": statistics.fmean(seconds) * 1e3,
        f"median_{name}_ms": percentile(seconds, 50) * 1e3,
        f"std_{name}_ms": statistics.pstdev(seconds) * 1e3,
    }
    out.update({f"p{p}_{name}_ms": percentile(seconds, p) * 1e3 for p in PERCENTILES})
    return out


def shed_summary(records: Sequence[RequestRecord]) -> dict[str, Any]:
    shed = [r for r in records if r.is_shed]
    refusals = [r.e2e for r in shed if not math.isnan(r.e2e)]
    return {
        "count": len(shed),
        "by_status": {str(s): n for s, n in sorted(Counter(r.status for r in shed).items())},
        "p50_ms": percentile(refusals, 50) * 1e3 if refusals else None,
        "p99_ms": percentile(refusals, 99) * 1e3 if refusals else None,
    }


def summarize(
    records: Sequence[RequestRecord], classes: Mapping[str, SloClass], duration_s: float, has_targets: bool
) -> dict[str, Any]:
    """One block of the report (a level, or one class of a level): counts, throughputs,
    goodput, attainment and latencies. `duration_s`: the level's wall time."""
    completed = [r for r in records if r.is_completed]
    num_shed = sum(r.is_shed for r in records)
    num_good = sum(meets(r, classes[r.slo_class]) for r in completed)
    num_admitted = len(records) - num_shed
    tokens_in = sum(r.prompt_len for r in completed)
    tokens_out = sum(r.num_output_tokens for r in completed)
    per_s = 1.0 / duration_s if duration_s > 0 else math.nan
    tpots = [t for r in completed if (t := r.tpot) is not None]
    return {
        "num_requests": len(records),
        "completed": len(completed),
        "failed": len(records) - len(completed) - num_shed,
        "shed": shed_summary(records),
        "total_input_tokens": tokens_in,
        "total_output_tokens": tokens_out,
        "request_throughput": len(completed) * per_s,
        "request_goodput": num_good * per_s if has_targets else None,
        "output_throughput": tokens_out * per_s,
        "total_token_throughput": (tokens_in + tokens_out) * per_s,
        "attainment": num_good / len(records) if has_targets and records else None,
        "attainment_of_admitted": num_good / num_admitted if has_targets and num_admitted else None,
        **latency_stats("ttft", [r.ttft for r in completed]),
        **latency_stats("tpot", tpots),
        **latency_stats("itl", [x for r in completed for x in r.itls]),
        **latency_stats("e2el", [r.e2e for r in completed]),
    }


def summarize_level(records: Sequence[RequestRecord], classes: Sequence[SloClass], duration_s: float) -> dict[str, Any]:
    """The level as a whole, and `per_class` beside it."""
    by_name = {c.name: c for c in classes}
    has_targets = any(not c.is_best_effort for c in classes)
    out = summarize(records, by_name, duration_s, has_targets)
    out["per_class"] = {
        c.name: summarize([r for r in records if r.slo_class == c.name], by_name, duration_s, has_targets)
        for c in classes
    }
    return out
