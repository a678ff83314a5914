"""Cost of the eBPF NUMA probes: an allocation-heavy workload with all probes loaded
against none, and the time one collection takes.

Workloads: ``touch`` maps anonymous memory without THP (the probes' worst case: one
mm_page_alloc and one page_fault_user event per 4 KiB page and nothing else), fills it
with memset and unmaps it; ``numpy`` allocates fresh float64 arrays, fills them with
random numbers and sums them. This process is watched (the per-process path) unless
--unwatched (the "other" path).

The probes are compiled once; each round then runs the workload three times, in
rotating order: with nothing attached, with empty programs on the same two hooks (the
cost of the hooks alone, the floor under any probe there), and with the probes.
Slowdowns are medians of the per-round ratios to the bare run, in thread CPU time (the
page faults' kernel time, where the probes run) and in wall time. The kernel's own
per-program run time (kernel.bpf_stats_enabled) is reported too. Needs root, bcc and
kernel headers.

    sudo .venv/bin/python scripts/bench_ebpf.py [--workload touch|numpy] [--unwatched]
        [--mib 128] [--loops 2] [--rounds 20] [--cpu N]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from inferd.exporters.ebpf_numa import EbpfNumaCollector


def touch_pages(num_bytes: int, loops: int) -> tuple[float, float]:
    """(thread CPU s, wall s) to map, fill and unmap num_bytes of fresh memory, loops times."""
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(loops):
        buf = mmap.mmap(-1, num_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf.madvise(mmap.MADV_NOHUGEPAGE)
        view = ctypes.c_char.from_buffer(buf)
        ctypes.memset(ctypes.addressof(view), 1, num_bytes)
        del view
        buf.close()
    return time.thread_time() - cpu, time.perf_counter() - wall


def numpy_churn(num_bytes: int, loops: int) -> tuple[float, float]:
    """(thread CPU s, wall s) to allocate, fill with random numbers and reduce a fresh
    float64 array of num_bytes, loops times: allocation-heavy numeric work (glibc maps
    arrays this large fresh and unmaps them on free)."""
    rng = np.random.default_rng(0)
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(loops):
        values = rng.standard_normal(num_bytes // 8)
        values.sum()
        del values
    return time.thread_time() - cpu, time.perf_counter() - wall


WORKLOADS = {"touch": touch_pages, "numpy": numpy_churn}


def set_attached(collector: EbpfNumaCollector, attached: bool) -> None:
    for name in collector.probe_names:
        probe = collector.probe(name)
        if probe is not None:
            probe.set_attached(attached)


EMPTY_PROGRAMS = """
TRACEPOINT_PROBE(kmem, mm_page_alloc) { return 0; }
RAW_TRACEPOINT_PROBE(page_fault_user) { return 0; }
"""


class EmptyHooks:
    """Programs that do nothing, on the hooks the probes use: the cost of the hooks alone."""

    def __init__(self):
        from bcc import BPF

        self.bpf = BPF(text=EMPTY_PROGRAMS.encode())
        self.attached = True  # bcc attached them on load

    def set_attached(self, attached: bool) -> None:
        if attached == self.attached:
            return
        self.attached = attached
        if attached:
            self.bpf.attach_tracepoint(tp=b"kmem:mm_page_alloc", fn_name=b"tracepoint__kmem__mm_page_alloc")
            self.bpf.attach_raw_tracepoint(tp=b"page_fault_user", fn_name=b"raw_tracepoint__page_fault_user")
        else:
            self.bpf.detach_tracepoint(b"kmem:mm_page_alloc")
            self.bpf.detach_raw_tracepoint(tp=b"page_fault_user")

    def close(self) -> None:
        self.bpf.cleanup()


def program_run_ns(collector: EbpfNumaCollector, workload, num_bytes: int, loops: int) -> dict[str, float]:
    """Mean in-kernel run time of each attached program over one workload run, from the
    kernel's own accounting (kernel.bpf_stats_enabled; /proc/self/fdinfo run_time_ns)."""
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    before = stats.read_text().strip()
    stats.write_text("1")
    try:
        start = {name: _run_stats(fd) for name, fd in _program_fds(collector).items()}
        workload(num_bytes, loops)
        end = {name: _run_stats(fd) for name, fd in _program_fds(collector).items()}
    finally:
        stats.write_text(before)
    means = {}
    for name, (ns, runs) in end.items():
        d_ns, d_runs = ns - start[name][0], runs - start[name][1]
        if d_runs:
            means[name] = round(d_ns / d_runs, 1)
    return means


def _program_fds(collector: EbpfNumaCollector) -> dict[str, int]:
    fds = {}
    for name in collector.probe_names:
        probe = collector.probe(name)
        if probe is not None:
            fds.update(probe.program_fds())
    return fds


def _run_stats(fd: int) -> tuple[int, int]:
    fields = dict(
        line.split(":\t", 1) for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines() if ":\t" in line
    )
    return int(fields.get("run_time_ns", 0)), int(fields.get("run_cnt", 0))


def time_collections(collector: EbpfNumaCollector, count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        for family in collector.collect():
            list(family.samples)
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128, help="memory touched per loop (MiB)")
    parser.add_argument("--loops", type=int, default=2, help="map/fill/unmap loops per timed run")
    parser.add_argument("--rounds", type=int, default=20, help="rounds, each timing every side")
    parser.add_argument("--collections", type=int, default=200, help="collections to time")
    parser.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="touch",
        help="touch: map+memset+unmap (worst case); numpy: random arrays allocated and reduced",
    )
    parser.add_argument(
        "--unwatched", action="store_true", help="do not watch the workload (the 'other' path most processes take)"
    )
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)), help="CPU to pin the workload to")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_ebpf: needs root to load BPF programs", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {args.cpu})  # one CPU's page lists and caches for all sides

    num_bytes = args.mib << 20
    pages_per_run = num_bytes // mmap.PAGESIZE * args.loops
    start = time.perf_counter()
    collector = EbpfNumaCollector(watch_pids=() if args.unwatched else (os.getpid(),))
    collector.start()
    load_seconds = time.perf_counter() - start
    empty = EmptyHooks()
    toggles = {
        "none": lambda: None,
        "empty": lambda: empty.set_attached(True),
        "probes": lambda: set_attached(collector, True),
    }
    sides: dict[str, list[tuple[float, float]]] = {side: [] for side in toggles}
    try:
        workload = WORKLOADS[args.workload]
        workload(num_bytes, 1)  # warm the allocator's per-CPU lists
        for round_index in range(args.rounds):
            order = list(toggles)[round_index % 3 :] + list(toggles)[: round_index % 3]
            for side in order:
                empty.set_attached(False)
                set_attached(collector, False)
                toggles[side]()
                sides[side].append(workload(num_bytes, args.loops))
        empty.set_attached(False)
        set_attached(collector, True)
        run_ns = program_run_ns(collector, workload, num_bytes, args.loops)
        collection_times = time_collections(collector, args.collections)
    finally:
        empty.close()
        collector.close()

    def slowdown_pct(side: str, index: int) -> float:
        ratios = [run[index] / base[index] for base, run in zip(sides["none"], sides[side])]
        return 100 * (statistics.median(ratios) - 1)

    def median(side: str, index: int = 0) -> float:
        return statistics.median(run[index] for run in sides[side])

    reasons = collector.probe_reasons
    result = {
        "workload": args.workload,
        "watched": not args.unwatched,
        "pages_per_run": pages_per_run,
        "cpu": args.cpu,
        "rounds": args.rounds,
        "probes_loaded": sorted(name for name, reason in reasons.items() if reason is None),
        "probes_down": {name: reason for name, reason in reasons.items() if reason},
        "slowdown_cpu_pct": slowdown_pct("probes", 0),
        "slowdown_wall_pct": slowdown_pct("probes", 1),
        "empty_hooks_slowdown_cpu_pct": slowdown_pct("empty", 0),
        "empty_hooks_slowdown_wall_pct": slowdown_pct("empty", 1),
        "baseline_pages_per_cpu_s": pages_per_run / median("none"),
        "probed_pages_per_cpu_s": pages_per_run / median("probes"),
        "extra_ns_per_page": 1e9 * (median("probes") - median("none")) / pages_per_run,
        "empty_hooks_extra_ns_per_page": 1e9 * (median("empty") - median("none")) / pages_per_run,
        "program_ns_per_run": run_ns,
        "load_s": load_seconds,
        "collection_ms_median": 1000 * statistics.median(collection_times),
        "collection_ms_p99": 1000 * sorted(collection_times)[int(0.99 * (len(collection_times) - 1))],
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
