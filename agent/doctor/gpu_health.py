"""GPU health from the GPU back end (NVML, or a replay of it): clock throttle reasons
(power, thermal, hardware slowdown, sync boost), XID errors, volatile uncorrected ECC
errors and row remapping pending or failed.

A live NVML run reads the GPUs a few times (`DoctorOptions.gpu_reads`); XIDs are those
NVML reports while the doctor watches. A replay gives every snapshot it holds.
"""

from __future__ import annotations

from collections import Counter

from .check import Check
from .findings import Evidence, Finding, FindingMaker
from .inputs import Inputs
from .thresholds import CLOCK_EVENT_REASONS, CRITICAL_XIDS, HARDWARE_CLOCK_REASONS, Thresholds

ID, LAYER = "gpu_health", "gpu"
TITLES = {
    "throttle": "GPU clocks not held back (power, thermal, hardware slowdown, sync boost)",
    "xid": "no XID errors",
    "memory": "no uncorrected ECC errors, no row remapping pending or failed",
}
finding = FindingMaker(ID, LAYER, TITLES)


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]


def run(inputs: Inputs, t: Thresholds) -> list[Finding]:
    snapshots = inputs.gpu_snapshots
    if not snapshots:
        return [finding.skip(what, inputs.why("gpu_backend")) for what in TITLES]
    source = inputs.gpu_source
    return [_throttle(snapshots, source, t), _xid(snapshots, source), _memory(snapshots, source)]


def _throttle(snapshots, source: str, t: Thresholds) -> Finding:
    seen: dict[int, Counter] = {}
    counted: Counter = Counter()
    for snapshot in snapshots:
        for gpu in snapshot.gpus:
            if gpu.clocks_event_reasons is None:
                continue
            counted[gpu.index] += 1
            seen.setdefault(gpu.index, Counter()).update(reason_names(int(gpu.clocks_event_reasons)))
    if not counted:
        return finding.skip("throttle", f"{source} gives no clock event reasons")
    evidence, problems, hardware = [], [], False
    for index in sorted(seen):
        for name, count in sorted(seen[index].items()):
            share = count / counted[index]
            evidence.append(Evidence(f"gpu{index}_{name}_share", share, source))
            if share >= t.throttle_share_warn:
                problems.append(f"GPU{index} {name} in {share:.0%} of {counted[index]} readings")
                hardware |= name in HARDWARE_CLOCK_REASONS
    if not problems:
        summary = f"no throttle reason in {sum(counted.values())} readings of {len(counted)} GPU(s)"
        return finding.ok("throttle", summary, evidence)
    return finding(
        "throttle",
        "fail" if hardware else "warn",
        "; ".join(problems),
        impact=0.3 if hardware else 0.15,
        evidence=evidence,
        fix="hardware or thermal slowdown: check cooling, fans and inlet temperature (`nvidia-smi -q -d "
        "PERFORMANCE,TEMPERATURE`) and the PSU/power brake; power cap: raise it with `nvidia-smi -pl` if the board "
        "allows; sync boost: drop the GPU from its sync-boost group",
    )


def _xid(snapshots, source: str) -> Finding:
    xids: dict[int, Counter] = {}
    for snapshot in snapshots:
        for gpu in snapshot.gpus:
            if gpu.xid_errors:
                xids.setdefault(gpu.index, Counter()).update(gpu.xid_errors)
    if not xids:
        summary = f"no XID in {len(snapshots)} reading(s)"
        return finding.ok("xid", summary, (Evidence("xid_count", 0, source),))
    evidence = [
        Evidence(f"gpu{i}_xid_{x}", n, source, "events")
        for i, counts in sorted(xids.items())
        for x, n in counts.items()
    ]
    critical = sorted({x for counts in xids.values() for x in counts if x in CRITICAL_XIDS})
    listing = "; ".join(f"GPU{i}: XID {', '.join(map(str, sorted(c)))}" for i, c in sorted(xids.items()))
    return finding(
        "xid",
        "fail" if critical else "warn",
        listing + (f" (critical: {', '.join(map(str, critical))})" if critical else ""),
        impact=0.5 if critical else 0.1,
        evidence=evidence,
        fix="look the XID up in NVIDIA's XID catalogue; 79 (fallen off the bus), 48/63/64/94/95 (memory errors) and "
        "119/120 (GSP) need the GPU drained and reset (`nvidia-smi -r`), and a replacement if they recur; "
        "13/31/43 are usually the application's fault",
    )


def _memory(snapshots, source: str) -> Finding:
    last = {gpu.index: gpu for snapshot in snapshots for gpu in snapshot.gpus}
    evidence, problems, failed = [], [], False
    offered = False
    for index, gpu in sorted(last.items()):
        if gpu.ecc_uncorrected_volatile is not None:
            offered = True
            evidence.append(Evidence(f"gpu{index}_ecc_uncorrected_volatile", gpu.ecc_uncorrected_volatile, source))
            if gpu.ecc_uncorrected_volatile > 0:
                problems.append(f"GPU{index}: {gpu.ecc_uncorrected_volatile} uncorrected ECC errors since reset")
                failed = True
        if gpu.remapped_rows_pending is not None:
            offered = True
            evidence.append(Evidence(f"gpu{index}_row_remap_pending", gpu.remapped_rows_pending, source))
            evidence.append(Evidence(f"gpu{index}_row_remap_failure", bool(gpu.remapped_rows_failure), source))
            if gpu.remapped_rows_failure:
                problems.append(f"GPU{index}: row remapping failed")
                failed = True
            elif gpu.remapped_rows_pending:
                problems.append(f"GPU{index}: row remapping pending (applies at the next GPU reset)")
    if not offered:
        return finding.skip("memory", f"{source} gives no ECC or row remapping state")
    if not problems:
        summary = f"{len(last)} GPU(s): no uncorrected ECC error, no row remapping pending or failed"
        return finding.ok("memory", summary, evidence)
    return finding(
        "memory",
        "fail" if failed else "warn",
        "; ".join(problems),
        impact=0.4 if failed else 0.1,
        evidence=evidence,
        fix="pending remaps apply at the next reset: drain the GPU and `nvidia-smi -r`; a failed remap or "
        "recurring uncorrected errors mean an RMA",
    )


CHECK = Check(ID, LAYER, "GPU health from NVML", run)
