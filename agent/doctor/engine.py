"""The engine: fast path active, CUDA graphs captured, fast-path failures (fallbacks);
decode memory-bandwidth utilisation from the engine's own counters (bytes read by
decode steps over their time) against the GPU's peak; and the GPU's regime from
SM-active against DRAM-active (memory-bound, compute-bound, or idle with requests
queued: host-bound).

The GPU figures are the agent's DCGM_FI_PROF_* gauges: their average over the window
with --prometheus, the instant value from --agent otherwise.
"""

from __future__ import annotations

from .check import Check
from .findings import Evidence, Finding, FindingMaker
from .inputs import Inputs
from .thresholds import GPU_PEAK_DRAM_BYTES_PER_SECOND, Thresholds

ID, LAYER = "engine", "engine"
TITLES = {
    "fast_path": "the fast path runs, CUDA graphs captured, no fallbacks",
    "mbu": "decode memory-bandwidth utilisation against the GPU's peak",
    "regime": "what bounds the GPU: memory, compute or the host",
}
finding = FindingMaker(ID, LAYER, TITLES)
# Counters the MBU figure needs from the engine; without them it is skipped, by name.
DECODE_BYTES = "inferd_engine_decode_bytes_read_total"
DECODE_SECONDS = "inferd_engine_decode_seconds_total"
CUDA_GRAPHS = "inferd_engine_cuda_graphs_captured"


def has_gpu(inputs: Inputs) -> bool:
    return bool(inputs.gpu_snapshots) or bool(inputs.topology and inputs.topology.gpus)


def run(inputs: Inputs, t: Thresholds) -> list[Finding]:
    return [_fast_path(inputs), _mbu(inputs, t), _regime(inputs, t)]


def _fast_path(inputs: Inputs) -> Finding:
    body, metrics = inputs.engine_config, inputs.engine
    if body is None and metrics is None:
        return finding.skip("fast_path", inputs.why("engine_config"))
    evidence: list[Evidence] = []
    not_judged: list[str] = []
    problems: list[str] = []
    failures = metrics.value("inferd_engine_fastpath_failures_total") if metrics is not None else None
    if metrics is not None and failures is not None:
        evidence.append(
            Evidence("fastpath_failures", failures, f"{metrics.source} inferd_engine_fastpath_failures_total")
        )
        if failures > 0:
            problems.append(f"{failures:.0f} fast-path failure(s) switched the engine to fallback")
    if metrics is not None and metrics.has(CUDA_GRAPHS):
        graphs = metrics.value(CUDA_GRAPHS) or 0.0
        evidence.append(Evidence("cuda_graphs_captured", graphs, f"{metrics.source} {CUDA_GRAPHS}"))
    else:
        not_judged.append(f"CUDA graphs captured: the engine does not export {CUDA_GRAPHS}")
        graphs = None
    if body is None:
        not_judged.append(f"which path runs: {inputs.why('engine_config')}")
        mode = None
        if metrics is not None:
            mode = "fallback" if metrics.value("inferd_engine_mode", mode="fallback") else "fast"
            evidence.append(Evidence("mode", mode, f"{metrics.source} inferd_engine_mode"))
        if mode == "fallback":
            problems.append("mode is fallback")
    else:
        path, reason, mode = body.get("path"), body.get("path_reason"), body.get("config", {}).get("mode")
        evidence += [
            Evidence("mode", mode, "engine:/admin/config"),
            Evidence("path", path, "engine:/admin/config"),
            Evidence("path_reason", reason, "engine:/admin/config"),
        ]
        if path != "fast":
            if mode != "fallback" and not has_gpu(inputs):
                return finding.skip("fast_path", f"no GPU on this node: the portable path runs ({reason})")
            problems.append(f"the {path} path runs: {reason}")
        elif graphs == 0:
            problems.append("the fast path runs without captured CUDA graphs")
    if not problems:
        summary = "the fast path runs" if body is not None else "no fast-path failure counted"
        return finding.ok("fast_path", summary, evidence, not_judged=not_judged)
    return finding(
        "fast_path",
        "warn",
        "; ".join(problems),
        impact=0.4,
        evidence=evidence,
        fix='read the engine log for the failure that switched it; once fixed, `POST /admin/mode {"mode": '
        '"fast"}` (or let remediation try it); on a GPU without Triton install triton',
        not_judged=not_judged,
    )


def _gpu_peak(inputs: Inputs) -> tuple[float | None, str]:
    for snapshot in inputs.gpu_snapshots:
        for gpu in snapshot.gpus:
            if gpu.name in GPU_PEAK_DRAM_BYTES_PER_SECOND:
                return GPU_PEAK_DRAM_BYTES_PER_SECOND[gpu.name], gpu.name
            return None, gpu.name
    return None, ""


def _mbu(inputs: Inputs, t: Thresholds) -> Finding:
    metrics = inputs.engine
    if metrics is None:
        return finding.skip("mbu", inputs.why("engine"))
    if not (metrics.has(DECODE_BYTES) and metrics.has(DECODE_SECONDS)):
        return finding.skip("mbu", f"the engine does not export {DECODE_BYTES} and {DECODE_SECONDS}")
    peak, name = _gpu_peak(inputs)
    if peak is None:
        why = f"no datasheet peak for {name!r}" if name else inputs.why("gpu_backend")
        return finding.skip("mbu", why)
    prometheus = inputs.prometheus
    if prometheus is not None:
        expr = f"sum(rate({DECODE_BYTES}[{prometheus.window}])) / sum(rate({DECODE_SECONDS}[{prometheus.window}]))"
        series = prometheus.range(expr)
        rate = series[0].values[-1] if series and series[0].values else None
        src = prometheus.source(expr)
    else:
        seconds = metrics.value(DECODE_SECONDS) or 0.0
        rate = (metrics.value(DECODE_BYTES) or 0.0) / seconds if seconds else None
        src = f"{metrics.source} {DECODE_BYTES} / {DECODE_SECONDS} (since start)"
    if rate is None:
        return finding.skip("mbu", "no decode step in the window")
    mbu = rate / peak
    evidence = (
        Evidence("decode_bytes_per_second", rate, src, "B/s"),
        Evidence("peak_dram_bytes_per_second", peak, f"thresholds: datasheet {name}", "B/s"),
        Evidence("mbu", mbu, src),
    )
    if mbu >= t.mbu_warn:
        return finding.ok("mbu", f"decode reads at {mbu:.0%} of peak", evidence)
    return finding(
        "mbu",
        "warn",
        f"decode reads at {mbu:.0%} of the GPU's peak (warn below {t.mbu_warn:.0%})",
        impact=(t.mbu_warn - mbu) / t.mbu_warn * 0.5,
        evidence=evidence,
        fix="check engine.fast_path and engine.regime first; at batch 1 raise max_num_seqs or batch more requests; "
        "with CUDA graphs off, turn them on",
    )


def _gpu_activity(inputs: Inputs) -> tuple[dict[str, float] | None, str, tuple[str, ...]]:
    """Mean SM-active and DRAM-active over the engine's GPUs, with their source."""
    names = ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE")
    prometheus = inputs.prometheus
    if prometheus is not None:
        values = {}
        for name in names:
            expr = f"avg(avg_over_time({name}[{prometheus.window}]))"
            series = prometheus.range(expr)
            if series and series[0].values:
                values[name] = series[0].values[-1]
        if len(values) == 2:
            return values, prometheus.source("avg(avg_over_time(DCGM_FI_PROF_{SM,DRAM}_ACTIVE[window]))"), ()
    if inputs.agent is not None:
        values = {}
        for name in names:
            found = inputs.agent.all(name)
            if found:
                values[name] = sum(s.value for s in found) / len(found)
        if len(values) == 2:
            return (
                values,
                f"{inputs.agent.source} (instant)",
                (f"activity over the window: {inputs.prometheus_reason()}",),
            )
        return None, "", ()
    return None, "", ()


def _regime(inputs: Inputs, t: Thresholds) -> Finding:
    activity, src, not_judged = _gpu_activity(inputs)
    if activity is None:
        reason = "no DCGM_FI_PROF_SM_ACTIVE / DRAM_ACTIVE: " + (
            "the agent has no GPU profiling metrics (no GPU or no GPM)"
            if inputs.agent is not None
            else inputs.why("agent")
        )
        return finding.skip("regime", reason)
    sm, dram = activity["DCGM_FI_PROF_SM_ACTIVE"], activity["DCGM_FI_PROF_DRAM_ACTIVE"]
    evidence = [Evidence("sm_active", sm, src), Evidence("dram_active", dram, src)]
    running = waiting = None
    if inputs.engine is not None:
        running = inputs.engine.value("vllm:num_requests_running")
        waiting = inputs.engine.value("vllm:num_requests_waiting")
        evidence += [
            Evidence("requests_running", running, f"{inputs.engine.source} vllm:num_requests_running"),
            Evidence("requests_waiting", waiting, f"{inputs.engine.source} vllm:num_requests_waiting"),
        ]
    busy_requests = (running or 0) + (waiting or 0)
    if dram >= t.regime_busy:
        summary = f"memory-bound: DRAM active {dram:.0%}, SM active {sm:.0%} (decode as it should be)"
        return finding.ok("regime", summary, evidence, not_judged=not_judged)
    if sm >= t.regime_busy:
        summary = f"compute-bound: SM active {sm:.0%}, DRAM active {dram:.0%} (prefill-heavy or large batches)"
        return finding.ok("regime", summary, evidence, not_judged=not_judged)
    if sm < t.regime_idle and dram < t.regime_idle and busy_requests > 0:
        return finding(
            "regime",
            "warn",
            f"host-bound: {busy_requests:.0f} request(s) in the engine but SM active {sm:.0%}, DRAM active {dram:.0%}",
            impact=0.5,
            evidence=evidence,
            fix="the GPU waits on the host: check placement (engine CPUs on the GPU's node), CPU frequency governor, "
            "engine.fast_path (CUDA graphs cut launch overhead) and tokenization load on the API server",
            not_judged=not_judged,
        )
    summary = f"SM active {sm:.0%}, DRAM active {dram:.0%}: " + ("idle" if busy_requests == 0 else "lightly loaded")
    if inputs.engine is None:
        not_judged = not_judged + (f"whether requests were queued: {inputs.why('engine')}",)
    return finding.ok("regime", summary, evidence, not_judged=not_judged)


CHECK = Check(ID, LAYER, "the engine's fast path, bandwidth use and GPU regime", run)
