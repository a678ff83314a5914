"""Engine throughput with the agent collecting every second against without.

Alternates runs without and with a live `inferd agent --no-engine` (real /sys and /proc,
the replay GPU back end, eBPF probes off so it runs unprivileged) whose /metrics is scraped
once a second, so both conditions see the same machine drift. Prints per-run tokens/s and
the median slowdown. Usage: python scripts/bench_agent_overhead.py --model DIR [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def scrape_every_second(url: str, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        try:
            urllib.request.urlopen(url, timeout=5).read()
        except OSError:
            pass


def main() -> int:
    from inferd.engine.bench.throughput import bench_engine, make_prompts

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=19477)
    args = parser.parse_args()
    vocab = json.loads(Path(args.model, "config.json").read_text())["vocab_size"]
    prompts = make_prompts(vocab, 16)
    without, with_agent = [], []
    for _ in range(args.rounds):
        without.append(bench_engine(args.model, prompts, 64))
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "inferd.agent.cli",
                "agent",
                "--no-engine",
                "--port",
                str(args.port),
                "--gpu-backend",
                f"replay:{REPO}/tests/fixtures/gpu/eight_h200.json",
                "--no-collector",
                "ebpf",
                "--log-level",
                "WARNING",
            ],
            cwd=REPO,
        )
        url = f"http://127.0.0.1:{args.port}/metrics"
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                time.sleep(0.2)
        stop = threading.Event()
        scraper = threading.Thread(target=scrape_every_second, args=(url, stop), daemon=True)
        scraper.start()
        try:
            with_agent.append(bench_engine(args.model, prompts, 64))
        finally:
            stop.set()
            agent.terminate()
            agent.wait(30)
    slowdown = 1 - statistics.median(with_agent) / statistics.median(without)
    print("without agent:", [round(x, 1) for x in without])
    print("with agent:   ", [round(x, 1) for x in with_agent])
    print(f"median slowdown: {slowdown * 100:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
