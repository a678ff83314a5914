"""Agent cost on the eight-GPU fixture host: collection cycle, /metrics render, RSS.

Run from the repo root:  .venv/bin/python scripts/bench_agent.py [--iterations N]

1. In process: the agent's collectors (GPU replay of eight H200s, PCIe and NUMA on the
   two-socket fixture tree, engine) in one CollectorSet; times one full collection
   (every family materialised) and one render of the collected families to the text
   format (the agent's renderer, and client_python's generate_latest for reference).
2. A real `inferd agent` process on the same inputs: times GET /metrics over HTTP and
   reads the agent's resident memory (VmRSS) after the requests, with the eBPF
   collector off; then once more with eBPF on (needs root and bcc), which reads this
   host's real /sys and /proc because the probes attach to the running kernel.

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


def wait_until_serving(url: str, process: subprocess.Popen, timeout_s: float = 120.0) -> float:
    """Poll the agent's /metrics until it answers; returns the deadline used."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return deadline
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("agent did not start") from None
            time.sleep(0.2)


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    return (
        statistics.median(ordered),
        ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        ordered[-1],
    )


def in_process(roots, iterations: int) -> dict[str, tuple[float, float, float]]:
    from prometheus_client import CollectorRegistry, generate_latest

    from inferd.agent.supervisor import EngineCollector
    from inferd.exporters.gpu import GpuCollector
    from inferd.exporters.gpu_replay import ReplayBackend
    from inferd.exporters.numa import NumaCollector
    from inferd.exporters.pcie import PcieCollector
    from inferd.exporters.registry import CollectorSet

    from fixture_trees import ENGINE_PID

    collectors = CollectorSet(
        [
            GpuCollector(ReplayBackend(EIGHT_GPUS)),
            PcieCollector(roots.sysfs),
            NumaCollector(roots.sysfs, roots.procfs, engine_pid_fn=lambda: ENGINE_PID, bound_node_fn=lambda: 0),
            EngineCollector(None),
        ]
    )
    from inferd.exporters.exposition import render_exposition

    families = list(collectors.collect())

    class Fixed:
        def collect(self):
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    for _ in range(20):
        render_exposition(families)
    cycle, render, reference = [], [], []
    for _ in range(iterations):
        t = time.perf_counter()
        list(collectors.collect())
        cycle.append(time.perf_counter() - t)
    for _ in range(iterations):
        t = time.perf_counter()
        text = render_exposition(families)
        render.append(time.perf_counter() - t)
    for _ in range(max(1, iterations // 4)):
        t = time.perf_counter()
        generate_latest(registry)
        reference.append(time.perf_counter() - t)
    return {
        "collection cycle": percentiles(cycle),
        "render": percentiles(render),
        "generate_latest": percentiles(reference),
        "_series": len([line for line in text.decode().splitlines() if line and not line.startswith("#")]),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_process(roots, requests: int, ebpf: bool) -> tuple[tuple[float, float, float], int]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "inferd.agent.cli",
        "agent",
        "--no-engine",
        "--port",
        str(port),
        "--gpu-backend",
        f"replay:{EIGHT_GPUS}",
        "--sysfs-root",
        str(roots.sysfs),
        "--procfs-root",
        str(roots.procfs),
    ]
    if not ebpf:
        command += ["--no-collector", "ebpf"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = wait_until_serving(url, process)
        if ebpf:  # probes load in a background thread; wait until one reports up
            loaded = b'inferd_ebpf_probe_up{probe="page_faults"} 1.0'
            while loaded not in urllib.request.urlopen(url, timeout=30).read():
                if time.monotonic() > deadline:
                    raise RuntimeError("eBPF probes did not load")
                time.sleep(0.5)
        latencies = []
        for _ in range(requests):
            t = time.perf_counter()
            urllib.request.urlopen(url, timeout=30).read()
            latencies.append(time.perf_counter() - t)
        status = Path(f"/proc/{process.pid}/status").read_text()
        rss_kib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    finally:
        process.terminate()
        process.wait(timeout=30)
    return percentiles(latencies), rss_kib


def agent_cpu_share(roots, seconds: float) -> float:
    """CPU time the agent uses per wall second while scraped once a second and pushing
    OTLP once a second (to a local sink): the cost an engine on the same host shares."""
    import http.server
    import threading

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inferd.agent.cli",
            "agent",
            "--no-engine",
            "--port",
            str(port),
            "--gpu-backend",
            f"replay:{EIGHT_GPUS}",
            "--sysfs-root",
            str(roots.sysfs),
            "--procfs-root",
            str(roots.procfs),
            "--no-collector",
            "ebpf",
            "--otlp-endpoint",
            f"http://127.0.0.1:{sink.server_address[1]}",
            "--otlp-interval",
            "1",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    tick = os.sysconf("SC_CLK_TCK")

    def cpu_seconds() -> float:
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick  # utime + stime

    try:
        wait_until_serving(url, process)
        time.sleep(2)
        cpu0, wall0 = cpu_seconds(), time.monotonic()
        next_at = wall0
        while time.monotonic() - wall0 < seconds:
            urllib.request.urlopen(url, timeout=30).read()
            next_at += 1.0
            time.sleep(max(0.0, next_at - time.monotonic()))
        return (cpu_seconds() - cpu0) / (time.monotonic() - wall0)
    finally:
        process.terminate()
        process.wait(timeout=30)
        sink.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--skip-ebpf", action="store_true")
    parser.add_argument("--cpu-seconds", type=float, default=30.0, help="wall seconds of the CPU-share run")
    args = parser.parse_args()
    from fixture_trees import write_host

    with tempfile.TemporaryDirectory() as tmp:
        roots = write_host(Path(tmp))
        results = in_process(roots, args.iterations)
        http_plain, rss_plain = agent_process(roots, args.requests, ebpf=False)
        cpu_share = agent_cpu_share(roots, args.cpu_seconds)
        ebpf_result = None
        if not args.skip_ebpf and os.geteuid() == 0:
            try:
                # the probes need the real kernel, so this run reads the real /sys and /proc
                from fixture_trees import HostRoots

                ebpf_result = agent_process(HostRoots(Path("/sys"), Path("/proc")), args.requests, ebpf=True)
            except RuntimeError as exc:
                print(f"eBPF run skipped: {exc}", file=sys.stderr)

    ms = lambda p: " / ".join(f"{x * 1000:.2f}" for x in p)  # noqa: E731
    print(
        f"{time.strftime('%Y-%m-%d')}, {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{results['_series']} series per scrape"
    )
    print("| measure | p50 / p99 / max (ms) |\n|---|---|")
    print(f"| collection cycle, in process ({args.iterations}x) | {ms(results['collection cycle'])} |")
    print(
        f"| /metrics render (agent.server.render_exposition), in process ({args.iterations}x) | {ms(results['render'])} |"
    )
    print(
        f"| same render with client_python generate_latest ({max(1, args.iterations // 4)}x) | {ms(results['generate_latest'])} |"
    )
    print(f"| GET /metrics over HTTP, eBPF off ({args.requests}x) | {ms(http_plain)} |")
    if ebpf_result:
        print(
            f"| GET /metrics over HTTP, eBPF on, real /sys and /proc of this host ({args.requests}x) | {ms(ebpf_result[0])} |"
        )
    print(
        f"\nagent RSS after the requests: {rss_plain / 1024:.1f} MiB with eBPF off"
        + (f", {ebpf_result[1] / 1024:.1f} MiB with eBPF on" if ebpf_result else "")
    )
    print(
        f"agent CPU while scraped every 1 s and pushing OTLP every 1 s: {cpu_share * 100:.2f}% of one core "
        f"({args.cpu_seconds:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
