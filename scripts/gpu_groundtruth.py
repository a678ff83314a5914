"""Check the GPU collector's numbers against workloads whose effect is known.

Run on a GPU host from the repo root:  PYTHONPATH=. python scripts/gpu_groundtruth.py --out DIR

A child process (torch) runs known workloads one after another on one GPU: idle, a
saturating bf16 matrix product, a device-to-device copy at full and at half duty,
pinned host-to-device and device-to-host copies. Each phase reports its own bytes,
FLOPs and wall-clock span. Meanwhile this process scrapes the real collector
(NvmlBackend + GpuCollector, GPM in its background sampler) every --scrape-interval
seconds and afterwards compares, per phase, the collector's values inside the phase
with what the workload did:

- DCGM_FI_PROF_SM_ACTIVE ~ 0 idle and ~ 1 under the matrix product;
- DCGM_FI_PROF_DRAM_ACTIVE against the copy's achieved bandwidth (bytes read plus
  written per second) over the peak computed from NVML (max memory clock x bus
  width x 2 transfers per clock), and half-duty / full-duty against the bandwidth ratio;
- DCGM_FI_PROF_PCIE_RX_BYTES / TX_BYTES against bytes copied per second, and the
  NVML cumulative PCIe byte counters (fields 197/198) over the same span.

Writes DIR/groundtruth.json (all numbers) and DIR/groundtruth_snapshots.json (every
snapshot, replay format, phases in meta); prints a Markdown table. Target: within 5%.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import sys
import time
from pathlib import Path

from inferd.exporters.gpu import snapshot_families
from inferd.exporters.gpu_nvml import NvmlBackend
from inferd.exporters.gpu_reading import GpuSnapshot
from inferd.exporters.gpu_replay import write_replay

PHASES = ("idle", "matmul", "copy_d2d", "copy_d2d_half", "copy_h2d", "copy_d2h")


def workload(device_index: int, seconds: float, results: mp.Queue) -> None:
    import torch

    torch.cuda.set_device(device_index)
    dev = torch.device("cuda", device_index)
    sync = torch.cuda.synchronize

    def timed(name: str, step, per_step_bytes: float = 0.0, per_step_flops: float = 0.0, duty: float = 1.0):
        for _ in range(3):
            step()
        sync()
        start = time.time()
        steps = 0
        busy = 0.0
        while time.time() - start < seconds:
            t = time.time()
            step()
            sync()
            busy += time.time() - t
            steps += 1
            if duty < 1.0:
                time.sleep((time.time() - t) * (1.0 - duty) / duty)
        end = time.time()
        results.put(
            {
                "name": name,
                "start": start,
                "end": end,
                "steps": steps,
                "busy_s": busy,
                "bytes": steps * per_step_bytes,
                "flops": steps * per_step_flops,
            }
        )

    start = time.time()
    time.sleep(seconds)
    results.put(
        {"name": "idle", "start": start, "end": time.time(), "steps": 0, "busy_s": 0.0, "bytes": 0.0, "flops": 0.0}
    )

    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    mm_per_step = 10

    def matmul():
        for _ in range(mm_per_step):
            torch.mm(a, b, out=c)

    timed("matmul", matmul, per_step_flops=mm_per_step * 2.0 * n**3)
    a = b = c = None  # free 384 MiB before the copies

    size = 2 << 30  # 2 GiB
    src = torch.empty(size, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty(size, dtype=torch.uint8, device=dev)
    copies = 20

    def d2d():
        for _ in range(copies):
            dst.copy_(src)

    timed("copy_d2d", d2d, per_step_bytes=copies * 2.0 * size)  # read + write
    timed("copy_d2d_half", d2d, per_step_bytes=copies * 2.0 * size, duty=0.5)
    src = dst = None

    size = 1 << 30  # 1 GiB pinned
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True).fill_(1)
    gpu_buf = torch.empty(size, dtype=torch.uint8, device=dev)
    transfers = 4

    def h2d():
        for _ in range(transfers):
            gpu_buf.copy_(host, non_blocking=True)

    def d2h():
        for _ in range(transfers):
            host.copy_(gpu_buf, non_blocking=True)

    timed("copy_h2d", h2d, per_step_bytes=transfers * float(size))
    timed("copy_d2h", d2h, per_step_bytes=transfers * float(size))
    results.put({"name": "done"})


def values_for_gpu(families, gpu: str) -> dict[str, float]:
    out = {}
    for family in families:
        for sample in family.samples:
            if sample.labels.get("gpu") != gpu:
                continue
            key = sample.name
            extra = {k: v for k, v in sample.labels.items() if k in ("type", "lane")}
            if extra:
                key += "{" + ",".join(f"{k}={v}" for k, v in sorted(extra.items())) + "}"
            out[key] = sample.value
    return out


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def rel_err(measured: float | None, expected: float | None) -> float | None:
    if measured is None or not expected:
        return None
    return (measured - expected) / expected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--phase-seconds", type=float, default=8.0)
    parser.add_argument("--gpm-interval", type=float, default=0.5)
    parser.add_argument("--scrape-interval", type=float, default=0.25)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import pynvml

    backend = NvmlBackend(gpm_interval_s=args.gpm_interval)
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
    bus_width_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
    max_mem_clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
    dram_peak = max_mem_clock_mhz * 1e6 * 2 * bus_width_bits / 8  # double data rate

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=workload, args=(args.gpu, args.phase_seconds, results), daemon=True)
    child.start()

    scrapes: list[tuple[float, dict[str, float]]] = []
    snapshots: list[GpuSnapshot] = []
    durations: list[float] = []
    phases: dict[str, dict] = {}
    next_at = time.monotonic()
    finished = False
    while not finished:
        t0 = time.perf_counter()
        snapshot = backend.read()
        values = values_for_gpu(list(snapshot_families(snapshot)), str(args.gpu))
        durations.append(time.perf_counter() - t0)
        scrapes.append((snapshot.timestamp, values))
        snapshots.append(snapshot)
        while not results.empty():
            item = results.get()
            if item["name"] == "done":
                finished = True
            else:
                phases[item["name"]] = item
        if not child.is_alive() and results.empty():
            finished = True
        next_at += args.scrape_interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    child.join(timeout=30)
    backend.close()
    if set(phases) != set(PHASES):
        print(f"workload ended early; phases seen: {sorted(phases)}", file=sys.stderr)

    settle = 2 * args.gpm_interval + 0.2  # the latest GPM window lies wholly inside the phase
    report: dict[str, dict] = {}
    for name, phase in phases.items():
        inside = [v for t, v in scrapes if phase["start"] + settle <= t <= phase["end"]]
        span = [(t, v) for t, v in scrapes if phase["start"] <= t <= phase["end"]]
        seconds = phase["end"] - phase["start"]
        entry = {
            "seconds": seconds,
            "scrapes": len(inside),
            "workload_bytes_per_s": phase["bytes"] / seconds if seconds else 0.0,
            "workload_tflops": phase["flops"] / seconds / 1e12 if seconds else 0.0,
            "busy_share": phase["busy_s"] / seconds if seconds else 0.0,
        }
        for key in (
            "DCGM_FI_PROF_SM_ACTIVE",
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            "DCGM_FI_PROF_PCIE_RX_BYTES",
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_SM_CLOCK",
        ):
            entry[key] = mean([v[key] for v in inside if key in v])
        if len(span) >= 2:
            (t_a, first), (t_b, last) = span[0], span[-1]
            for counter in ("inferd_pcie_tx_bytes_total", "inferd_pcie_rx_bytes_total"):
                if counter in first and counter in last:
                    entry[counter + "_per_s"] = (last[counter] - first[counter]) / (t_b - t_a)
        report[name] = entry

    checks = []

    def check(what: str, measured, expected, tolerance: float = 0.05, absolute: bool = False):
        if measured is None or expected is None:
            checks.append({"check": what, "measured": measured, "expected": expected, "error": None, "ok": False})
            return
        error = measured - expected if absolute else rel_err(measured, expected)
        checks.append(
            {
                "check": what,
                "measured": measured,
                "expected": expected,
                "error": error,
                "ok": error is not None and abs(error) <= tolerance,
                "absolute": absolute,
            }
        )

    get = lambda phase, key: report.get(phase, {}).get(key)  # noqa: E731
    check("SM active, idle (absolute)", get("idle", "DCGM_FI_PROF_SM_ACTIVE"), 0.0, absolute=True)
    check("SM active, matmul (absolute)", get("matmul", "DCGM_FI_PROF_SM_ACTIVE"), 1.0, absolute=True)
    for phase in ("copy_d2d", "copy_d2d_half"):
        bw = get(phase, "workload_bytes_per_s")
        check(
            f"DRAM active, {phase} vs achieved/peak",
            get(phase, "DCGM_FI_PROF_DRAM_ACTIVE"),
            bw / dram_peak if bw else None,
        )
    full, half = get("copy_d2d", "DCGM_FI_PROF_DRAM_ACTIVE"), get("copy_d2d_half", "DCGM_FI_PROF_DRAM_ACTIVE")
    bw_full, bw_half = get("copy_d2d", "workload_bytes_per_s"), get("copy_d2d_half", "workload_bytes_per_s")
    if full and half and bw_full and bw_half:
        check("DRAM active half/full vs bandwidth half/full", half / full, bw_half / bw_full)
    check(
        "PCIe RX bytes/s (GPM), h2d",
        get("copy_h2d", "DCGM_FI_PROF_PCIE_RX_BYTES"),
        get("copy_h2d", "workload_bytes_per_s"),
    )
    check(
        "PCIe TX bytes/s (GPM), d2h",
        get("copy_d2h", "DCGM_FI_PROF_PCIE_TX_BYTES"),
        get("copy_d2h", "workload_bytes_per_s"),
    )
    check(
        "PCIe RX bytes/s (field 198, 32-bit, wraps every 4 GiB), h2d",
        get("copy_h2d", "inferd_pcie_rx_bytes_total_per_s"),
        get("copy_h2d", "workload_bytes_per_s"),
    )
    check(
        "PCIe TX bytes/s (field 197, 32-bit, wraps every 4 GiB), d2h",
        get("copy_d2h", "inferd_pcie_tx_bytes_total_per_s"),
        get("copy_d2h", "workload_bytes_per_s"),
    )

    sorted_durations = sorted(durations)
    first = snapshots[0].gpus[args.gpu] if snapshots else None
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": first.name if first else None,
        "driver": snapshots[0].driver_version if snapshots else None,
        "python": platform.python_version(),
        "dram_peak_bytes_per_s": dram_peak,
        "bus_width_bits": bus_width_bits,
        "max_mem_clock_mhz": max_mem_clock_mhz,
        "gpm_interval_s": args.gpm_interval,
        "phase_seconds": args.phase_seconds,
        "scrape_seconds_p50": sorted_durations[len(durations) // 2] if durations else None,
        "scrape_seconds_p99": sorted_durations[int(len(durations) * 0.99)] if durations else None,
        "phases": report,
        "checks": checks,
    }
    try:
        import torch

        summary["torch"] = torch.__version__
    except ImportError:
        pass
    (args.out / "groundtruth.json").write_text(json.dumps(summary, indent=1) + "\n")
    write_replay(
        args.out / "groundtruth_snapshots.json",
        snapshots,
        {"phases": phases, "recorded_by": "scripts/gpu_groundtruth.py"},
    )

    print("| check | collector | workload | error | within 5% |\n|---|---|---|---|---|")
    for c in checks:
        err = c["error"]
        err_text = "n/a" if err is None else (f"{err:+.3f} abs" if c.get("absolute") else f"{err:+.1%}")
        fmt = lambda x: "n/a" if x is None else f"{x:.4g}"  # noqa: E731
        print(
            f"| {c['check']} | {fmt(c['measured'])} | {fmt(c['expected'])} | {err_text} | {'yes' if c['ok'] else 'no'} |"
        )
    print(json.dumps({k: {kk: vv for kk, vv in v.items()} for k, v in report.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
