"""PCIe, every hop from GPU to root port: links trained below their ceiling, upstream
links shared by GPUs that move data at once, AER error and replay rates over the
window, and Max Payload Size / Max Read Request Size / ASPM from each device's PCI
Express capability (sysfs `config`), with mismatches along the path.

Links and AER counts come from sysfs (the topology `inferd topo` prints); rates and the
GPUs' simultaneous traffic from Prometheus (the agent's pcie and gpu collectors).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from inferd.agent.topo_cmd import ROLE_NAMES, degraded_hops, shared_upstream_links
from inferd.agent.topology import GpuTopology, Topology
from inferd.exporters.pcie import AER_FILES
from inferd.exporters.pcie_parsers import (
    PcieCapability,
    link_capacity_bytes_per_second,
    parse_aer_counters,
    parse_pcie_capability,
)
from inferd.exporters.sysfs import read_optional

from .check import Check
from .findings import Evidence, Finding, FindingMaker
from .inputs import Inputs
from .thresholds import Thresholds

ID, LAYER = "pcie", "pcie"


def device_dir(sysfs: Path, bdf: str) -> Path:
    return sysfs / "bus" / "pci" / "devices" / bdf


def run(inputs: Inputs, t: Thresholds) -> list[Finding]:
    topology = inputs.topology
    if topology is None or not topology.gpus:
        reason = inputs.missing.get("topology") or inputs.why("gpus")
        return [finding.skip(what, reason) for what in TITLES]
    return [
        _links(inputs, topology, t),
        _shared(inputs, topology, t),
        _errors(inputs, topology, t),
        _payload(inputs, topology, t),
    ]


TITLES = {
    "link": "every link on the GPU paths trained at its ceiling",
    "shared": "upstream links shared by GPUs that transfer at once",
    "errors": "AER errors and replays over the window",
    "payload": "Max Payload Size, Max Read Request Size and ASPM along each path",
}
finding = FindingMaker(ID, LAYER, TITLES)


def _gpu_ceiling(gpu: GpuTopology) -> float | None:
    own = gpu.path[0]
    return link_capacity_bytes_per_second(own.max_speed_gts, own.max_width)


def _links(inputs: Inputs, topology: Topology, t: Thresholds) -> Finding:
    hops = degraded_hops(topology)
    evidence = []
    worst = 1.0
    for gpu in topology.gpus:
        ceiling, bottleneck = _gpu_ceiling(gpu), gpu.bottleneck_bytes_per_second
        if ceiling and bottleneck:
            worst = min(worst, bottleneck / ceiling)
    for d in hops:
        base = f"sysfs:{device_dir(inputs.sysfs, d['device'])}"
        role = ROLE_NAMES.get(d["role"], d["role"])
        name = f"gpu{d['gpu']}_hop{d['hop']}_{d['device']}"
        evidence.append(Evidence(name, f"{d['current']} ({role})", f"{base}/current_link_{{speed,width}}"))
        evidence.append(Evidence(f"{name}_ceiling", d["max"], f"{base}/max_link_{{speed,width}} (both ends)"))
    for gpu in topology.gpus:
        ceiling, bottleneck = _gpu_ceiling(gpu), gpu.bottleneck_bytes_per_second
        if ceiling and bottleneck and bottleneck < ceiling:
            evidence.append(Evidence(f"gpu{gpu.index}_bottleneck_share", bottleneck / ceiling, "sysfs: path links"))
    if not hops:
        summary = (
            f"all {sum(len(g.path) for g in topology.gpus)} hops of {len(topology.gpus)} GPU paths at their ceiling"
        )
        return finding.ok("link", summary, evidence)
    gpus = sorted({d["gpu"] for d in hops})
    status = "fail" if worst < t.pcie_bottleneck_fail else "warn"
    first = hops[0]
    summary = (
        f"{len(hops)} hop(s) trained below their ceiling on GPU(s) {','.join(map(str, gpus))}, e.g. "
        f"{first['device']} at {first['current']} (max {first['max']}); the worst path carries {worst:.0%} "
        f"of its GPU's link (fail below {t.pcie_bottleneck_fail:.0%})"
    )
    fix = (
        "reseat the GPU or riser and check the slot's lane wiring (BIOS bifurcation setting); "
        "retrain with `setpci -s <port> CAP_EXP+10.w=0020:0020` or a reboot, and replace the riser/cable if it "
        "comes back degraded"
    )
    impact = (1 - worst) * len(gpus) / len(topology.gpus)
    return finding("link", status, summary, impact=min(max(impact, 0.05), 1.0), evidence=evidence, fix=fix)


def _shared(inputs: Inputs, topology: Topology, t: Thresholds) -> Finding:
    shared = shared_upstream_links(topology)
    evidence = [
        Evidence(f"{s['device']}_shared_by", "GPUs " + ",".join(map(str, s["gpus"])), "sysfs: GPU paths")
        for s in shared
    ]
    if not shared:
        return finding.ok("shared", "no upstream link carries more than one GPU")
    prometheus = inputs.prometheus
    if prometheus is None:
        return finding.ok(
            "shared",
            f"{len(shared)} upstream link(s) carry several GPUs; whether they transfer at once was not judged",
            evidence,
            not_judged=(f"simultaneous transfers behind shared links: {inputs.prometheus_reason()}",),
        )
    by_bus = {g.pci_bus_id: g.index for g in topology.gpus}
    busy: list[str] = []
    for direction in ("tx", "rx"):
        expr = f"sum by (pci_bus_id) (rate(inferd_pcie_{direction}_bytes_total[1m]))"
        per_gpu: dict[int, dict[float, float]] = {}
        for series in prometheus.range(expr):
            index = by_bus.get(series.labels.get("pci_bus_id", ""))
            if index is not None:
                per_gpu[index] = dict(series.points)
        for s in shared:
            hop = next(h for g in topology.gpus for h in g.path if h.device == s["device"])
            capacity = hop.capacity_bytes_per_second
            if not capacity:
                continue
            times = sorted({time for i in s["gpus"] for time in per_gpu.get(i, {})})
            peak = 0.0
            for time in times:
                rates = [per_gpu.get(i, {}).get(time, 0.0) for i in s["gpus"]]
                if sum(1 for r in rates if r > 0.1 * capacity) >= 2:
                    peak = max(peak, sum(rates) / capacity)
            evidence.append(Evidence(f"{s['device']}_{direction}_peak_share", peak, prometheus.source(expr)))
            if peak >= t.pcie_shared_busy:
                busy.append(f"{s['device']} ({direction} {peak:.0%} of {capacity / 1e9:.1f} GB/s)")
    if not busy:
        summary = f"{len(shared)} shared upstream link(s); no two GPUs behind one filled it at once"
        return finding.ok("shared", summary, evidence)
    return finding(
        "shared",
        "warn",
        f"GPUs behind {', '.join(busy)} moved data at once, past {t.pcie_shared_busy:.0%} of the shared link",
        impact=0.2,
        evidence=evidence,
        fix="place engines that swap or load at once on GPUs behind different switches (`inferd topo`, PIX vs PHB), "
        "or stagger their model loads",
    )


def _errors(inputs: Inputs, topology: Topology, t: Thresholds) -> Finding:
    devices = sorted({hop.device for gpu in topology.gpus for hop in gpu.path})
    evidence: list[Evidence] = []
    since_boot: dict[str, dict[str, int]] = defaultdict(dict)
    for bdf in devices:
        for severity, name in AER_FILES.items():
            path = device_dir(inputs.sysfs, bdf) / name
            text = read_optional(path)
            if text is None:
                continue
            total = sum(parse_aer_counters(text).values())
            since_boot[bdf][severity] = total
            if total:
                evidence.append(Evidence(f"{bdf}_{severity}_since_boot", total, f"sysfs:{path}"))
    prometheus = inputs.prometheus
    if prometheus is None:
        uncorrectable = [b for b, c in since_boot.items() if c.get("nonfatal") or c.get("fatal")]
        not_judged = (f"error and replay rates over the window: {inputs.prometheus_reason()}",)
        if uncorrectable:
            return finding(
                "errors",
                "warn",
                f"uncorrectable AER errors since boot on {', '.join(uncorrectable)} (rate not judged)",
                impact=0.1,
                evidence=evidence,
                fix=_ERRORS_FIX,
                not_judged=not_judged,
            )
        corrected = sum(c.get("correctable", 0) for c in since_boot.values())
        summary = f"no uncorrectable AER errors since boot; {corrected} correctable (rate not judged)"
        return finding.ok("errors", summary, evidence, not_judged=not_judged)
    minutes = (prometheus.end - prometheus.start) / 60
    window = prometheus.window
    problems: list[tuple[str, str]] = []
    aer_expr = f"sum by (device, severity) (increase(inferd_pcie_aer_errors_total[{window}]))"
    on_paths = set(devices)
    for series in prometheus.range(aer_expr):
        device, severity = series.labels.get("device", ""), series.labels.get("severity", "")
        if device not in on_paths or not series.values:
            continue
        count = max(series.values[-1], 0.0)
        evidence.append(Evidence(f"{device}_{severity}_in_window", count, prometheus.source(aer_expr)))
        if severity in ("fatal", "nonfatal") and count > 0:
            problems.append(("fail", f"{count:.0f} {severity} AER errors on {device}"))
        elif severity == "correctable" and count / minutes >= t.pcie_correctable_per_minute_warn:
            problems.append(("warn", f"{count / minutes:.1f} correctable AER errors/min on {device}"))
    replay_expr = f"sum by (pci_bus_id) (increase(inferd_pcie_replay_total[{window}]))"
    by_bus = {g.pci_bus_id: g.index for g in topology.gpus}
    for series in prometheus.range(replay_expr):
        index = by_bus.get(series.labels.get("pci_bus_id", ""))
        if index is None or not series.values:
            continue
        count = max(series.values[-1], 0.0)
        evidence.append(Evidence(f"gpu{index}_replays_in_window", count, prometheus.source(replay_expr)))
        if count / minutes >= t.pcie_replays_per_minute_warn:
            problems.append(("warn", f"{count / minutes:.1f} PCIe replays/min on GPU{index}"))
    if not problems:
        summary = f"no uncorrectable AER errors and correctable/replay rates under threshold over {window}"
        return finding.ok("errors", summary, evidence)
    status = "fail" if any(s == "fail" for s, _ in problems) else "warn"
    return finding(
        "errors",
        status,
        f"over {window}: " + "; ".join(p for _, p in problems),
        impact=0.3 if status == "fail" else 0.1,
        evidence=evidence,
        fix=_ERRORS_FIX,
    )


_ERRORS_FIX = (
    "a link that keeps correcting or replaying is marginal: reseat the card or riser, check the slot's signal "
    "integrity (retimer firmware, cable), and lower the link to the previous generation in the BIOS if it persists"
)


def read_capability(inputs: Inputs, bdf: str) -> tuple[PcieCapability | None, str | None]:
    """(capability, None) or (None, why it could not be read)."""
    path = device_dir(inputs.sysfs, bdf) / "config"
    try:
        config = path.read_bytes()
    except OSError as exc:
        return None, f"{path} unreadable: {exc}"
    try:
        capability = parse_pcie_capability(config)
    except ValueError as exc:
        return None, f"{path}: {exc}"
    if capability is None:
        if len(config) <= 64:
            return None, f"{path} shows only the 64-byte header (the rest needs root)"
        return None, f"{path}: no PCI Express capability"
    return capability, None


def _payload(inputs: Inputs, topology: Topology, t: Thresholds) -> Finding:
    evidence: list[Evidence] = []
    flagged: list[Evidence] = []  # the evidence of the paths with a problem
    problems: list[str] = []
    unread: list[str] = []
    t_mrrs = t.pcie_min_read_request_bytes
    for gpu in topology.gpus:
        caps = []
        path_evidence = []
        for hop in gpu.path:
            capability, why = read_capability(inputs, hop.device)
            if capability is None:
                unread.append(f"{hop.device}: {why}")
                continue
            src = f"sysfs:{device_dir(inputs.sysfs, hop.device)}/config"
            caps.append((hop, capability))
            path_evidence.append(
                Evidence(
                    f"gpu{gpu.index}_{hop.device}",
                    f"MPS {capability.mps_bytes} (max {capability.mps_supported_bytes}), MRRS {capability.mrrs_bytes}, "
                    f"ASPM {'+'.join(capability.aspm_enabled) or 'off'}",
                    src,
                )
            )
        before = len(problems)
        sizes = {c.mps_bytes for _, c in caps}
        if len(sizes) > 1:
            detail = ", ".join(f"{h.device} {c.mps_bytes}" for h, c in caps)
            problems.append(f"GPU{gpu.index} path: Max Payload Size differs along the path ({detail})")
        if caps and caps[0][0].role == "gpu":
            own = caps[0][1]
            if own.mrrs_bytes < t_mrrs:
                problems.append(f"GPU{gpu.index}: Max Read Request Size {own.mrrs_bytes} B (below {t_mrrs})")
            if own.aspm_enabled:
                problems.append(f"GPU{gpu.index}: ASPM {'+'.join(own.aspm_enabled)} enabled on its link")
        evidence += path_evidence
        if len(problems) > before:
            flagged += path_evidence
    if not evidence:
        return finding.skip("payload", "config space unreadable: " + "; ".join(unread[:2]))
    not_judged = tuple(unread[:4]) + ((f"... and {len(unread) - 4} more",) if len(unread) > 4 else ())
    if not problems:
        summary = "Max Payload Size agrees along every path; read requests and ASPM as expected"
        return finding.ok("payload", summary, evidence, not_judged=not_judged)
    return finding(
        "payload",
        "warn",
        "; ".join(problems),
        impact=0.1,
        evidence=flagged,
        fix="let the kernel set the path consistently (boot with pci=pcie_bus_perf, or set MPS to the lowest "
        "supported along the path with setpci); raise MRRS to 512+ B; disable ASPM on GPU links "
        "(pcie_aspm=off or the BIOS)",
        not_judged=not_judged,
    )


CHECK = Check(ID, LAYER, "PCIe path from each GPU to its root port", run)
