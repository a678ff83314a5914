"""The KV cache: thrashing (page faults and preemptions per second against usage),
fragmentation, and the fault rate against sequence length fitted as
lambda(L) = alpha (1 - exp(-beta L)) over the window (agent.doctor.fault_fit).

Per Prometheus step: lambda = fault rate / (step rate x used blocks), faults per
scheduled block; L = used blocks x block size / running sequences, the mean context.
"""

from __future__ import annotations

from .check import Check
from .fault_fit import fit_fault_rate
from .findings import Evidence, Finding, FindingMaker
from .inputs import Inputs, Samples
from .thresholds import Thresholds

ID, LAYER = "kv_cache", "kv_cache"
TITLES = {
    "thrashing": "KV cache not thrashing (page faults and preemptions against usage)",
    "fragmentation": "KV blocks not fragmented",
    "fault_fit": "page-fault rate against sequence length, lambda(L) = alpha (1 - exp(-beta L))",
}
finding = FindingMaker(ID, LAYER, TITLES)
RATE = "2m"
FAULTS = f"sum(rate(inferd_kv_page_faults_total[{RATE}]))"
STEPS = f"sum(rate(inferd_scheduler_step_duration_seconds_count[{RATE}]))"
# averaged over the rate's own range, so every column describes the same two minutes
USED = f'sum(avg_over_time(inferd_kv_blocks{{state="used"}}[{RATE}]))'
RUNNING = f"sum(avg_over_time(vllm:num_requests_running[{RATE}]))"
USAGE = "max(vllm:kv_cache_usage_perc)"
DEFAULT_BLOCK_SIZE = 16


def block_size(engine: Samples | None) -> tuple[int | None, str]:
    if engine is not None:
        for sample in engine.all("vllm:cache_config_info"):
            size = sample.labels.get("block_size", "")
            if size.isdigit():
                return int(size), f"{engine.source} vllm:cache_config_info block_size"
    return None, ""


def run(inputs: Inputs, t: Thresholds) -> list[Finding]:
    return [_thrashing(inputs, t), _fragmentation(inputs, t), _fault_fit(inputs, t)]


def _thrashing(inputs: Inputs, t: Thresholds) -> Finding:
    prometheus = inputs.prometheus
    if prometheus is None:
        return finding.skip("thrashing", f"fault and preemption rates need the window: {inputs.prometheus_reason()}")
    window = prometheus.window
    faults_expr = f"sum(increase(inferd_kv_page_faults_total[{window}]))"
    preempt_expr = f"sum(increase(vllm:num_preemptions_total[{window}]))"
    usage_expr = f"max(max_over_time(vllm:kv_cache_usage_perc[{window}]))"
    seconds = prometheus.end - prometheus.start

    def last(expr: str) -> float | None:
        series = prometheus.range(expr)
        return series[0].values[-1] if series and series[0].values else None

    faults, preemptions, usage = last(faults_expr), last(preempt_expr), last(usage_expr)
    if faults is None and usage is None:
        return finding.skip("thrashing", f"Prometheus has no engine KV series over {window}")
    fault_rate = (faults or 0.0) / seconds
    preempt_rate = (preemptions or 0.0) / seconds
    evidence = (
        Evidence("page_faults_per_second", fault_rate, prometheus.source(faults_expr), "1/s"),
        Evidence("preemptions_per_second", preempt_rate, prometheus.source(preempt_expr), "1/s"),
        Evidence("kv_usage_max", usage, prometheus.source(usage_expr)),
    )
    pressure = fault_rate + preempt_rate
    full = usage is not None and usage >= t.kv_usage_thrash
    if pressure >= t.kv_faults_per_second_fail and full:
        status = "fail"
    elif pressure >= t.kv_faults_per_second_warn:
        status = "warn"
    else:
        summary = f"{fault_rate:.2f} faults/s, {preempt_rate:.2f} preemptions/s over {window}"
        return finding.ok("thrashing", summary, evidence)
    return finding(
        "thrashing",
        status,
        f"{fault_rate:.2f} page faults/s and {preempt_rate:.2f} preemptions/s over {window} with KV usage up to "
        f"{(usage or 0):.0%} (fail at {t.kv_faults_per_second_fail:g}/s with usage >= {t.kv_usage_thrash:.0%})",
        impact=0.5 if status == "fail" else 0.2,
        evidence=evidence,
        fix="the pool is too small for the load: lower max_num_seqs (PATCH /admin/config), turn on cold-KV "
        "quantization (kv_cold_dtype int8), or give the engine more KV memory (gpu_memory_utilization); "
        "preemption_mode recompute avoids swap traffic for short prompts",
    )


def _fragmentation(inputs: Inputs, t: Thresholds) -> Finding:
    prometheus = inputs.prometheus
    value, src = None, ""
    if prometheus is not None:
        expr = f"max(avg_over_time(inferd_kv_fragmentation_ratio[{prometheus.window}]))"
        series = prometheus.range(expr)
        if series and series[0].values:
            value, src = series[0].values[-1], prometheus.source(expr)
    if value is None and inputs.engine is not None:
        value = inputs.engine.value("inferd_kv_fragmentation_ratio")
        src = f"{inputs.engine.source} inferd_kv_fragmentation_ratio"
    if value is None:
        return finding.skip("fragmentation", inputs.why("engine"))
    evidence = (Evidence("fragmentation_ratio", value, src),)
    if value < t.kv_fragmentation_warn:
        return finding.ok("fragmentation", f"{value:.0%} of allocated KV slots hold no token", evidence)
    return finding(
        "fragmentation",
        "warn",
        f"{value:.0%} of allocated KV slots hold no token (warn at {t.kv_fragmentation_warn:.0%})",
        impact=0.1,
        evidence=evidence,
        fix="many short sequences leave their last blocks mostly empty: a smaller --block-size (8) wastes less",
    )


def fit_points(inputs: Inputs) -> tuple[list[float], list[float], list[str]]:
    """(lengths, rates, sources) joined by timestamp over the window."""
    prometheus = inputs.prometheus
    assert prometheus is not None
    size, _ = block_size(inputs.engine)
    size = size or DEFAULT_BLOCK_SIZE
    columns = {}
    for key, expr in (("faults", FAULTS), ("steps", STEPS), ("used", USED), ("running", RUNNING)):
        series = prometheus.range(expr)
        columns[key] = dict(series[0].points) if series else {}
    lengths, rates = [], []
    for time in sorted(columns["faults"]):
        steps, used, running = (columns[k].get(time) for k in ("steps", "used", "running"))
        if not steps or not used or not running:
            continue
        lengths.append(used * size / running)
        rates.append(columns["faults"][time] / (steps * used))
    return lengths, rates, [FAULTS, STEPS, USED, RUNNING]


def _fault_fit(inputs: Inputs, t: Thresholds) -> Finding:
    if inputs.prometheus is None:
        return finding.skip("fault_fit", f"the fit needs the window's samples: {inputs.prometheus_reason()}")
    lengths, rates, exprs = fit_points(inputs)
    if len(lengths) < t.fit_min_points:
        return finding.skip("fault_fit", f"{len(lengths)} busy step(s) in the window, the fit needs {t.fit_min_points}")
    try:
        fit = fit_fault_rate(lengths, rates)
    except ValueError as exc:
        return finding.skip("fault_fit", str(exc))
    src = "prometheus:" + " ; ".join(exprs)
    evidence = (
        Evidence("alpha", fit.alpha, src, "faults/block"),
        Evidence("beta", fit.beta, src, "1/token"),
        Evidence("r2", fit.r2, src),
        Evidence("points", fit.num_points, src),
        Evidence("mean_length_now", lengths[-1], src, "tokens"),
    )
    now = fit.rate(lengths[-1])
    summary = (
        f"lambda(L) = {fit.alpha:.3g} (1 - exp(-{fit.beta:.3g} L)), R^2 {fit.r2:.2f} over {fit.num_points} steps; "
        f"at today's mean length {lengths[-1]:.0f} the rate is {now / fit.alpha if fit.alpha else 0:.0%} of its ceiling"
    )
    not_judged = () if fit.r2 >= t.fit_r2_min else (f"the fit explains little (R^2 {fit.r2:.2f} < {t.fit_r2_min})",)
    return finding.ok("fault_fit", summary, evidence, not_judged=not_judged)


CHECK = Check(ID, LAYER, "KV cache thrashing, fragmentation and the fault-rate fit", run)
