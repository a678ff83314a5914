"""Agent cost on the eight-GPU fixture host: collection cycle, /metrics render, RSS.

Run from the repo root:  .venv/bin/python scripts/bench_agent.py [--iterations N]

1. In process: the agent's collectors (GPU replay of eight H200s, PCIe and NUMA on the
   two-socket fixture tree, engine) in one CollectorSet; times one full collection
   (every family materialised) and one `generate_latest` render, N times each.
2. A real `inferd agent` process on the same inputs: times GET /metrics over HTTP and
   reads the agent's resident memory (VmRSS) after the requests, with the eBPF
   collector off and on (on needs root and bcc; it loads its probes).

Prints a Markdown table for BENCHMARKS.md. Timings, not assertions.
"""
from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

EIGHT_GPUS = REPO / "tests" / "fixtures" / "gpu" / "eight_h200.json"


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    return (
        statistics.median(ordered),
        ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        ordered[-1],
    )


def in_process(roots, iterations: int) -> dict[str, tuple[float, float, float]]:
    from prometheus_client import CollectorRegistry, generate_latest

    from agent.supervisor import EngineCollector
    from exporters.gpu import GpuCollector
    from exporters.gpu_backends import ReplayBackend
    from exporters.numa import NumaCollector
    from exporters.pcie import PcieCollector
    from exporters.registry import CollectorSet
    from fixture_trees import ENGINE_PID

    collectors = CollectorSet([
        GpuCollector(ReplayBackend(EIGHT_GPUS)),
        PcieCollector(roots.sysfs),
        NumaCollector(roots.sysfs, roots.procfs, engine_pid_fn=lambda: ENGINE_PID, bound_node_fn=lambda: 0),
        EngineCollector(None),
    ])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collectors)
    for _ in range(20):
        generate_latest(registry)
    cycle, render = [], []
    for _ in range(iterations):
        t = time.perf_counter()
        list(collectors.collect())
        cycle.append(time.perf_counter() - t)
    for _ in range(iterations):
        t = time.perf_counter()
        text = generate_latest(registry)
        render.append(time.perf_counter() - t)
    return {"collection cycle": percentiles(cycle), "/metrics render (generate_latest)": percentiles(render),
            "_series": len([l for l in text.decode().splitlines() if l and not l.startswith("#")])}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_process(roots, requests: int, ebpf: bool) -> tuple[tuple[float, float, float], int]:
    port = free_port()
    command = [sys.executable, "-m", "agent.cli", "agent", "--no-engine", "--port", str(port),
               "--gpu-backend", f"replay:{EIGHT_GPUS}", "--sysfs-root", str(roots.sysfs),
               "--procfs-root", str(roots.procfs)]
    if not ebpf:
        command += ["--no-collector", "ebpf"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("agent did not start")
                time.sleep(0.2)
        if ebpf:
            time.sleep(5)  # probes load in a background thread
        latencies = []
        for _ in range(requests):
            t = time.perf_counter()
            urllib.request.urlopen(url, timeout=10).read()
            latencies.append(time.perf_counter() - t)
        status = Path(f"/proc/{process.pid}/status").read_text()
        rss_kib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    finally:
        process.terminate()
        process.wait(timeout=30)
    return percentiles(latencies), rss_kib


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--skip-ebpf", action="store_true")
    args = parser.parse_args()
    from fixture_trees import write_host

    with tempfile.TemporaryDirectory() as tmp:
        roots = write_host(Path(tmp))
        results = in_process(roots, args.iterations)
        http_plain, rss_plain = agent_process(roots, args.requests, ebpf=False)
        ebpf_result = None
        if not args.skip_ebpf and os.geteuid() == 0:
            try:
                ebpf_result = agent_process(roots, args.requests, ebpf=True)
            except RuntimeError as exc:
                print(f"eBPF run skipped: {exc}", file=sys.stderr)

    ms = lambda p: " / ".join(f"{x * 1000:.2f}" for x in p)  # noqa: E731
    print(f"{time.strftime('%Y-%m-%d')}, {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{results['_series']} series per scrape")
    print("| measure | p50 / p99 / max (ms) |\n|---|---|")
    print(f"| collection cycle, in process ({args.iterations}x) | {ms(results['collection cycle'])} |")
    print(f"| /metrics render, in process ({args.iterations}x) | {ms(results['/metrics render (generate_latest)'])} |")
    print(f"| GET /metrics over HTTP, eBPF off ({args.requests}x) | {ms(http_plain)} |")
    if ebpf_result:
        print(f"| GET /metrics over HTTP, eBPF on ({args.requests}x) | {ms(ebpf_result[0])} |")
    print(f"\nagent RSS after the requests: {rss_plain / 1024:.1f} MiB with eBPF off"
          + (f", {ebpf_result[1] / 1024:.1f} MiB with eBPF on" if ebpf_result else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
