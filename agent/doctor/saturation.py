"""Saturation: the load at which throughput stops rising and p99 latency jumps (the knee,
from the second differences of throughput over load: inferd.knee, the finder
`inferd bench serve` uses too), the current load against it, and the headroom
(requests/s the node can still take at its step-time SLO; agent.doctor.headroom).

The knee comes from a sweep file (`inferd bench serve` output, or a results record in
benchmarks/results/) or, without one, from the Prometheus window: throughput against
requests in the engine (running + waiting), binned by that concurrency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from inferd.knee import find_knee

from . import headroom as hr
from .check import Check
from .findings import Evidence, Finding, FindingMaker
from .inputs import Inputs
from .thresholds import Thresholds

ID, LAYER = "saturation", "load"
TITLES = {
    "knee": "current load below the throughput knee",
    "headroom": "requests/s the node can still take at its step-time SLO",
}
finding = FindingMaker(ID, LAYER, TITLES)
RATE = "2m"
TOKENS = f"sum(rate(vllm:generation_tokens_total[{RATE}]))"
CONCURRENCY = "sum(vllm:num_requests_running) + sum(vllm:num_requests_waiting)"


@dataclass(frozen=True, slots=True)
class Level:
    load: float  # offered requests/s (a sweep) or requests in the engine (the window)
    throughput: float  # output tokens/s
    p99_s: float  # TTFT p99, else ITL p99; NaN when unknown


@dataclass(frozen=True, slots=True)
class Knee:
    index: int
    load: float
    throughput: float
    latency_jump: float | None  # p99 at the next level over p99 at the knee


def sweep_levels(doc: dict[str, Any], name: str | None = None) -> list[Level]:
    """Levels of an `inferd bench serve` JSON (levels: [{offered_rps, ...}]) or of a
    benchmarks/results record (figures: {name: {levels: rows}}, level_columns)."""
    if isinstance(doc.get("levels"), list):
        out = []
        for level in doc["levels"]:
            p99 = level.get("ttft_p99")
            p99 = level.get("itl_p99") if p99 is None else p99
            out.append(Level(float(level["offered_rps"]), float(level["output_tokens_per_s"]), _num(p99)))
        return out
    figures = doc.get("figures")
    if isinstance(figures, dict):
        columns = figures.get("level_columns")
        runs = {k: v for k, v in figures.items() if isinstance(v, dict) and "levels" in v}
        if not columns or not runs:
            raise ValueError("sweep record has no figures.level_columns or no figures with levels")
        if name is not None and name not in runs:
            raise ValueError(f"sweep record has no run {name!r}; it has {', '.join(runs)}")
        rows = runs[name or next(iter(runs))]["levels"]
        col = {c: i for i, c in enumerate(columns)}
        p99_col = "ttft_p99_ms" if "ttft_p99_ms" in col else "itl_p99_ms"
        return [
            Level(
                float(r[col["offered_req_s"]]),
                float(r[col["output_tok_s"]]),
                float(r[col[p99_col]]) / 1e3 if p99_col in col else math.nan,
            )
            for r in rows
        ]
    raise ValueError("not a sweep: expected `levels` (inferd bench serve) or `figures` (a results record)")


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def knee_of(levels: list[Level]) -> Knee | None:
    index = find_knee([lv.load for lv in levels], [lv.throughput for lv in levels])
    if index is None:
        return None
    jump = None
    if index + 1 < len(levels):
        here, after = levels[index].p99_s, levels[index + 1].p99_s
        if here > 0 and not math.isnan(here) and not math.isnan(after):
            jump = after / here
    return Knee(index, levels[index].load, levels[index].throughput, jump)


def window_levels(inputs: Inputs, bins: int = 8) -> list[Level]:
    """Throughput against concurrency over the window, in up to `bins` equal-count bins."""
    prometheus = inputs.prometheus
    assert prometheus is not None
    tokens = prometheus.range(TOKENS)
    load = prometheus.range(CONCURRENCY)
    if not tokens or not load:
        return []
    by_time = dict(load[0].points)
    pairs = sorted((by_time[t], v) for t, v in tokens[0].points if t in by_time and by_time[t] > 0)
    if len(pairs) < 3:
        return []
    size = max(1, len(pairs) // bins)
    levels = []
    for start in range(0, len(pairs), size):
        chunk = pairs[start : start + size]
        levels.append(Level(sum(c for c, _ in chunk) / len(chunk), sum(v for _, v in chunk) / len(chunk), math.nan))
    merged: list[Level] = []
    for level in levels:  # find_knee needs rising, distinct loads
        if merged and level.load <= merged[-1].load:
            continue
        merged.append(level)
    return merged


def run(inputs: Inputs, t: Thresholds) -> list[Finding]:
    return [_knee(inputs, t), _headroom(inputs, t)]


def _current_rps(inputs: Inputs) -> tuple[float | None, str]:
    prometheus = inputs.prometheus
    if prometheus is None:
        return None, ""
    expr = f"sum(rate(vllm:request_success_total[{prometheus.window}]))"
    series = prometheus.range(expr)
    if series and series[0].values:
        return series[0].values[-1], prometheus.source(expr)
    return None, ""


def _knee(inputs: Inputs, t: Thresholds) -> Finding:
    evidence: list[Evidence] = []
    if inputs.sweep is not None:
        try:
            levels = sweep_levels(inputs.sweep)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            return finding.skip("knee", f"sweep file {inputs.options.sweep_path}: {exc}")
        src, unit = f"sweep:{inputs.options.sweep_path}", "req/s"
        current, current_src = _current_rps(inputs)
    elif inputs.prometheus is not None:
        levels = window_levels(inputs)
        src, unit = inputs.prometheus.source(f"{TOKENS} against {CONCURRENCY}"), "requests in the engine"
        current = None
        if inputs.engine is not None:
            current = (inputs.engine.value("vllm:num_requests_running") or 0) + (
                inputs.engine.value("vllm:num_requests_waiting") or 0
            )
        current_src = f"{inputs.engine.source} running + waiting" if inputs.engine is not None else ""
    else:
        return finding.skip("knee", f"{inputs.why('sweep')}, and {inputs.prometheus_reason()}")
    if not levels:
        if inputs.sweep is not None:
            where = f"sweep file {inputs.options.sweep_path} has no levels"
        else:
            where = f"Prometheus has no {TOKENS} while {CONCURRENCY} > 0 over the window"
        return finding.skip("knee", f"no data: {where}")
    if len(levels) < 3:
        return finding.skip("knee", f"too little data: {len(levels)} load level(s), a knee needs 3")
    knee = knee_of(levels)
    if knee is None:
        return finding.skip("knee", f"no knee in {len(levels)} levels: throughput never stops rising")
    evidence += [
        Evidence("knee_load", knee.load, src, unit),
        Evidence("knee_throughput", knee.throughput, src, "tokens/s"),
    ]
    if knee.latency_jump is not None:
        evidence.append(Evidence("p99_jump_after_knee", knee.latency_jump, src, "x"))
    jumped = knee.latency_jump is not None and knee.latency_jump >= t.latency_jump
    jump = f", p99 latency x{knee.latency_jump:.1f} at the next level" if jumped else ""
    if current is None:
        summary = f"knee at {knee.load:g} {unit} ({knee.throughput:.0f} tokens/s){jump}; current load unknown"
        why = f"current load: {inputs.prometheus_reason()}" if inputs.prometheus is None else "current load unknown"
        return finding.ok("knee", summary, evidence, not_judged=(why,))
    share = current / knee.load if knee.load else 0.0
    evidence += [Evidence("current_load", current, current_src, unit), Evidence("load_over_knee", share, src)]
    summary = f"load {current:.3g} {unit} is {share:.0%} of the knee at {knee.load:g}{jump}"
    if share < t.knee_load_warn:
        return finding.ok("knee", summary, evidence)
    status = "fail" if share >= t.knee_load_fail else "warn"
    return finding(
        "knee",
        status,
        summary + f" (warn at {t.knee_load_warn:.0%}, fail at {t.knee_load_fail:.0%})",
        impact=0.5 if status == "fail" else 0.2,
        evidence=evidence,
        fix="past the knee more load only adds queueing: shed or route load to another node, or raise the knee "
        "(fix the other findings first; more KV memory or a larger max_num_seqs if KV-bound)",
    )


def _headroom(inputs: Inputs, t: Thresholds) -> Finding:
    if inputs.agent is not None:
        room = inputs.agent.value("inferd_headroom_requests_per_second")
        capacity = inputs.agent.value("inferd_headroom_capacity_requests_per_second")
        if room is not None and capacity is not None:
            src = f"{inputs.agent.source} inferd_headroom_*"
            return _headroom_finding(room, capacity, src, t, None)
    if inputs.prometheus is None:
        why = "the agent has no headroom figure yet" if inputs.agent is not None else inputs.why("agent")
        return finding.skip("headroom", f"{why}, and {inputs.prometheus_reason()}")
    prometheus = inputs.prometheus
    step = f"sum(rate({hr.STEP_SUM}[{RATE}])) / sum(rate({hr.STEP_COUNT}[{RATE}]))"
    batch = f"sum(rate({hr.BATCH_SUM}[{RATE}])) / sum(rate({hr.BATCH_COUNT}[{RATE}]))"
    window = prometheus.window
    per_request = f"sum(increase({hr.GEN_SUM}[{window}])) / sum(increase({hr.GEN_COUNT}[{window}]))"
    step_s, batch_s, per = prometheus.range(step), prometheus.range(batch), prometheus.range(per_request)
    if not step_s or not batch_s or not per or not per[0].values:
        return finding.skip("headroom", f"no engine step or request series in Prometheus over {window}")
    steps = dict(step_s[0].points)
    points = [(b, steps[time]) for time, b in batch_s[0].points if time in steps]
    current, _ = _current_rps(inputs)
    max_seqs = None
    if inputs.engine_config is not None:
        max_seqs = inputs.engine_config.get("config", {}).get("max_num_seqs")
    elif inputs.engine is not None:
        max_seqs = inputs.engine.value("inferd_engine_tunable", param="max_num_seqs")
    result = hr.estimate(
        points, t.headroom_step_slo_seconds, per[0].values[-1], current or 0.0, max_seqs, t.headroom_min_points
    )
    if result is None:
        return finding.skip("headroom", "step time never varied with batch size in the window: no slope")
    src = prometheus.source(f"{step} against {batch}")
    return _headroom_finding(result.headroom_rps, result.capacity_rps, src, t, t.headroom_step_slo_seconds)


def _headroom_finding(room: float, capacity: float, src: str, t: Thresholds, slo_s: float | None) -> Finding:
    """`slo_s` None: the agent's figure, at the agent's own --headroom-step-slo."""
    evidence = [Evidence("headroom_rps", room, src, "req/s"), Evidence("capacity_rps", capacity, src, "req/s")]
    if slo_s is not None:
        evidence.append(Evidence("step_slo_seconds", slo_s, "thresholds: headroom_step_slo_seconds", "s"))
    at = f"a {slo_s * 1e3:g} ms step" if slo_s is not None else "the agent's --headroom-step-slo"
    summary = f"{room:.3g} req/s of {capacity:.3g} req/s left at {at}"
    if capacity <= 0:
        return finding(
            "headroom",
            "warn",
            summary + ": the step time exceeds the SLO even at batch 1",
            impact=0.3,
            evidence=evidence,
            fix="see engine.regime and engine.fast_path: steps are slow before the batch grows",
        )
    if room / capacity >= 1 - t.knee_load_warn:
        return finding.ok("headroom", summary, evidence)
    return finding(
        "headroom",
        "warn",
        summary + f" (warn under {1 - t.knee_load_warn:.0%} left)",
        impact=0.2,
        evidence=evidence,
        fix="the node is near capacity at its SLO: route new load elsewhere or add a replica",
    )


CHECK = Check(ID, LAYER, "throughput knee, current load and headroom", run)
