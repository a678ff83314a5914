"""`--active` only (it loads the GPU and the host): pinned host<->device copy bandwidth
against the GPU link's capacity, and device-to-device copy bandwidth against the GPU's
peak DRAM bandwidth (datasheet, thresholds.GPU_PEAK_DRAM_BYTES_PER_SECOND), each with
its share, the way DCGM's level-2/3 diagnostics report them.

A device copy reads and writes each byte, so it moves 2 x size per copy; the figure
is that traffic over time, the same convention as the DRAM peak.
"""

from __future__ import annotations

import time

from .check import Check
from .findings import Evidence, Finding, FindingMaker
from .inputs import Inputs
from .thresholds import GPU_PEAK_DRAM_BYTES_PER_SECOND, Thresholds

ID, LAYER = "copy_bandwidth", "gpu"
TITLE = "copy bandwidth against the link's and the GPU's ceilings"
finding = FindingMaker(ID, LAYER, TITLE)  # one finding per GPU: gpu0, gpu1, ...
HOST_BYTES = 1 << 30
DEVICE_BYTES = 4 << 30
REPEATS = 10


def _timed(torch, fn, repeats: int) -> float:
    fn()  # warm up: first touch, allocator, copy engines
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def measure(index: int) -> dict[str, float]:
    """Bytes/s of pinned h2d, pinned d2h and d2d (read + write) copies on GPU `index`."""
    import torch

    device = torch.device("cuda", index)
    host = torch.empty(HOST_BYTES, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(HOST_BYTES, dtype=torch.uint8, device=device)
    src = torch.empty(DEVICE_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    with torch.cuda.device(device):
        h2d = _timed(torch, lambda: dev.copy_(host, non_blocking=True), REPEATS)
        d2h = _timed(torch, lambda: host.copy_(dev, non_blocking=True), REPEATS)
        d2d = _timed(torch, lambda: dst.copy_(src), REPEATS)
    return {"h2d": HOST_BYTES / h2d, "d2h": HOST_BYTES / d2h, "d2d": 2 * DEVICE_BYTES / d2d}


def run(inputs: Inputs, t: Thresholds) -> list[Finding]:
    try:
        import torch
    except ImportError as exc:
        return [finding.skip("all", f"torch is not installed: {exc}")]
    if not torch.cuda.is_available():
        return [finding.skip("all", "no CUDA device visible to torch")]
    names = {g.index: g.name for s in inputs.gpu_snapshots for g in s.gpus}
    links = {g.index: g.link_capacity_bytes_per_second for g in (inputs.topology.gpus if inputs.topology else ())}
    findings = []
    for index in range(torch.cuda.device_count()):
        findings.append(
            _one(index, measure(index), names.get(index) or torch.cuda.get_device_name(index), links.get(index), t)
        )
    return findings


def _one(index: int, rates: dict[str, float], name: str, link: float | None, t: Thresholds) -> Finding:
    peak = GPU_PEAK_DRAM_BYTES_PER_SECOND.get(name)
    evidence = [Evidence(f"{k}_bytes_per_second", v, "measured", "B/s") for k, v in rates.items()]
    shares: dict[str, float] = {}
    not_judged = []
    if link:
        evidence.append(Evidence("link_capacity_bytes_per_second", link, "sysfs: GPU link width x rate", "B/s"))
        shares["h2d"], shares["d2h"] = rates["h2d"] / link, rates["d2h"] / link
    else:
        not_judged.append("host copies against the link: the GPU's link is not in the topology")
    if peak:
        evidence.append(Evidence("peak_dram_bytes_per_second", peak, f"thresholds: datasheet {name}", "B/s"))
        shares["d2d"] = rates["d2d"] / peak
    else:
        not_judged.append(f"device copy against peak: no datasheet peak for {name!r}")
    evidence += [Evidence(f"{k}_share", v, "measured") for k, v in shares.items()]
    text = ", ".join(f"{k} {rates[k] / 1e9:.1f} GB/s" + (f" ({shares[k]:.0%})" if k in shares else "") for k in rates)
    low = {k: v for k, v in shares.items() if v < t.copy_share_warn}
    if not low:
        return finding.ok(f"gpu{index}", f"GPU{index}: {text}", evidence, not_judged=not_judged)
    status = "fail" if any(v < t.copy_share_fail for v in low.values()) else "warn"
    return finding(
        f"gpu{index}",
        status,
        f"GPU{index}: {text}; under {t.copy_share_warn:.0%}: {', '.join(sorted(low))}",
        impact=0.3 if status == "fail" else 0.1,
        evidence=evidence,
        fix="host copies low: see pcie.link, pcie.payload and placement (pinned memory on the GPU's node); "
        "device copies low: see gpu_health.throttle",
        not_judged=not_judged,
    )


CHECK = Check(ID, LAYER, TITLE, run, active_only=True)
