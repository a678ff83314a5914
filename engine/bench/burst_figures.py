"""The burst's figures per phase (offline, server non-stream, server stream), from the
offline engine's or the client's per-request records, and the table printed from them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .serve import percentile

if TYPE_CHECKING:
    from .burst_client import BurstResult
    from .burst_offline import OfflineResult


@dataclass(slots=True)
class PhaseFigures:
    phase: str
    num_requests: int
    num_ok: int  # no error and exactly output_len tokens
    num_errors: int
    num_wrong_token_count: int
    wall_s: float
    output_tokens: int
    output_tok_s: float
    ratio_to_offline: float | None  # to the offline greedy phase
    ratio_to_greedy: float | None  # a sampled phase: to the greedy phase of its own side and mode
    ttft_p50: float | None  # offline: first token; streaming: first chunk with text; None non-streaming
    ttft_p99: float | None
    prefill_s: float | None  # until every request had its first token (chunk), from submission
    first_text_p50: float | None  # offline only: first output with text, to compare with streaming TTFT
    e2e_p50: float | None  # None when no request finished
    e2e_p99: float | None
    client_cpu_s: float | None  # server phases: the load generator's CPU time over the burst
    mean_chunks: float | None  # streaming: chunks carrying a choice, per request
    tokens: list[int]  # per request: output tokens as counted (engine) or reported (usage)
    errors: list[str]  # the first few distinct error messages


def _finite(values: list[float]) -> list[float]:
    return [v for v in values if v == v]


def _or_none(x: float) -> float | None:
    return None if x is None or math.isnan(x) else x


def offline_figures(
    result: OfflineResult, output_len: int, greedy_tok_s: float | None = None, label: str = ""
) -> PhaseFigures:
    """`greedy_tok_s`: the offline greedy phase's, for a sampled phase (`label` names it)."""
    tokens = result.num_tokens
    wrong = sum(t != output_len for t in tokens)
    first = _finite(result.first_token)
    return PhaseFigures(
        phase="offline" + label,
        num_requests=len(tokens),
        num_ok=len(tokens) - wrong,
        num_errors=0,
        num_wrong_token_count=wrong,
        wall_s=result.wall_s,
        output_tokens=sum(tokens),
        output_tok_s=sum(tokens) / result.wall_s,
        ratio_to_offline=sum(tokens) / result.wall_s / greedy_tok_s if greedy_tok_s else 1.0,
        ratio_to_greedy=sum(tokens) / result.wall_s / greedy_tok_s if greedy_tok_s else None,
        ttft_p50=_or_none(percentile(first, 50)),
        ttft_p99=_or_none(percentile(first, 99)),
        prefill_s=max(first) if len(first) == len(tokens) else None,
        first_text_p50=_or_none(percentile(_finite(result.first_text), 50)),
        # Offline every request finishes in the same step as the others of its length.
        e2e_p50=result.wall_s,
        e2e_p99=result.wall_s,
        client_cpu_s=None,
        mean_chunks=None,
        tokens=tokens,
        errors=[],
    )


def server_figures(
    burst: BurstResult,
    stream: bool,
    output_len: int,
    offline_tok_s: float | None,
    greedy_tok_s: float | None = None,
    label: str = "",
) -> PhaseFigures:
    """`greedy_tok_s`: the server's greedy phase of the same mode, for a sampled phase."""
    reqs = burst.requests
    errors = [r for r in reqs if r.error]
    wrong = [r for r in reqs if not r.error and r.num_tokens != output_len]
    tokens = [max(r.num_tokens, 0) for r in reqs]
    tok_s = sum(tokens) / burst.wall_s
    ttfts = _finite([r.ttft for r in reqs if not r.error]) if stream else []
    e2e = [r.e2e for r in reqs if not r.error]
    return PhaseFigures(
        phase=("server stream" if stream else "server non-stream") + label,
        num_requests=len(reqs),
        num_ok=len(reqs) - len(errors) - len(wrong),
        num_errors=len(errors),
        num_wrong_token_count=len(wrong),
        wall_s=burst.wall_s,
        output_tokens=sum(tokens),
        output_tok_s=tok_s,
        ratio_to_offline=tok_s / offline_tok_s if offline_tok_s else None,
        ratio_to_greedy=tok_s / greedy_tok_s if greedy_tok_s else None,
        ttft_p50=_or_none(percentile(ttfts, 50)) if stream else None,
        ttft_p99=_or_none(percentile(ttfts, 99)) if stream else None,
        prefill_s=max(ttfts) if stream and len(ttfts) == len(reqs) else None,
        first_text_p50=None,
        e2e_p50=_or_none(percentile(e2e, 50)),
        e2e_p99=_or_none(percentile(e2e, 99)),
        client_cpu_s=burst.client_cpu_s,
        mean_chunks=sum(r.num_chunks for r in reqs) / len(reqs) if stream else None,
        tokens=[r.num_tokens for r in reqs],
        errors=sorted({r.error for r in errors})[:5],
    )


def _fmt(x: float | None, scale: float = 1.0, spec: str = ".1f") -> str:
    return "-" if x is None else format(x * scale, spec)


def print_table(phases: list[PhaseFigures]) -> None:
    print(
        f"{'phase':<26} {'ok/N':>9} {'out tok/s':>10} {'x offline':>9} {'x greedy':>8} {'TTFT p50/p99 ms':>17} "
        f"{'prefill s':>9} {'e2e p50/p99 s':>15} {'client CPU s':>12}"
    )
    for ph in phases:
        ttft = f"{_fmt(ph.ttft_p50, 1e3)}/{_fmt(ph.ttft_p99, 1e3)}"
        e2e = f"{_fmt(ph.e2e_p50, 1, '.2f')}/{_fmt(ph.e2e_p99, 1, '.2f')}"
        print(
            f"{ph.phase:<26} {f'{ph.num_ok}/{ph.num_requests}':>9} {ph.output_tok_s:10.1f} "
            f"{_fmt(ph.ratio_to_offline, 1, '.3f'):>9} {_fmt(ph.ratio_to_greedy, 1, '.3f'):>8} {ttft:>17} {_fmt(ph.prefill_s, 1, '.2f'):>9} "
            f"{e2e:>15} {_fmt(ph.client_cpu_s, 1, '.2f'):>12}"
        )
        for err in ph.errors:
            print(f"  error: {err}")
