"""`inferd bench serve`: the server at rising offered loads.

For each offered load (requests per second: exactly rate x `--duration` requests,
Poisson-timed) it sends streaming completions with random prompt lengths and a fixed
number of output tokens (ignore_eos), then reports per level: TTFT and inter-token
latency p50/p99, end-to-end p50, achieved request and output-token throughput.
The knee is where throughput stops growing while latency climbs: the level where
the slope of throughput over offered load drops the most (most negative second
difference). Writes a JSON report and a PNG plot.

Without --url it starts `inferd serve` in a subprocess on a free loopback port (the
embedded tiny model unless --model or --preset says otherwise) and stops it after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import platform
import random
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from inferd.knee import find_knee

log = logging.getLogger(__name__)


@dataclass(slots=True)
class BenchConfig:
    rates: list[float]
    duration_s: float = 20.0
    prompt_len_min: int = 16
    prompt_len_max: int = 256
    max_tokens: int = 64
    seed: int = 0
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.rates or any(not (isinstance(r, (int, float)) and r > 0) for r in self.rates):
            raise ValueError(f"rates must be positive numbers, got {self.rates!r}")
        if sorted(self.rates) != list(self.rates):
            raise ValueError(f"rates must rise, got {self.rates!r}")
        if not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s!r}")
        if not 1 <= self.prompt_len_min <= self.prompt_len_max:
            raise ValueError(
                f"need 1 <= prompt_len_min <= prompt_len_max, got {self.prompt_len_min}, {self.prompt_len_max}"
            )
        if self.max_tokens < 2:
            raise ValueError(f"max_tokens must be >= 2 (inter-token latency needs two tokens), got {self.max_tokens}")


@dataclass(slots=True)
class RequestResult:
    ok: bool
    ttft: float = math.nan
    itls: list[float] = field(default_factory=list)
    e2e: float = math.nan
    num_tokens: int = 0
    error: str = ""


@dataclass(slots=True)
class LevelResult:
    offered_rps: float
    sent_rps: float
    num_requests: int
    num_failed: int
    wall_s: float
    achieved_rps: float
    output_tokens_per_s: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    e2e_p50: float


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def make_prompt(rng: random.Random, words: list[str], length: int) -> str:
    return " ".join(rng.choice(words) for _ in range(length))


WORDS = (
    "the engine keeps key value cache blocks sequence table batch step token memory host device "
    "scheduler prefix swap page fault model layer node socket link"
).split()


async def _one_request(client, url: str, model: str, prompt: str, max_tokens: int, timeout: float) -> RequestResult:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    last = None
    result = RequestResult(ok=False)
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    result.num_tokens = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices"):
                    continue
                now = time.perf_counter()
                if last is None:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
    except Exception as exc:  # count it, keep the benchmark going
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.e2e = time.perf_counter() - start
    result.ok = last is not None
    return result


async def run_level(url: str, model: str, rate: float, cfg: BenchConfig, rng: random.Random) -> LevelResult:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits) as client:
        tasks = []
        # A Poisson process with exactly N arrivals in [0, T) has its arrival times uniform
        # and independent: every level sends exactly rate x T requests, Poisson-timed.
        arrivals = sorted(rng.uniform(0.0, cfg.duration_s) for _ in range(max(1, round(rate * cfg.duration_s))))
        start = time.perf_counter()
        for t in arrivals:
            delay = start + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            prompt = make_prompt(rng, WORDS, rng.randint(cfg.prompt_len_min, cfg.prompt_len_max))
            tasks.append(asyncio.create_task(_one_request(client, url, model, prompt, cfg.max_tokens, cfg.timeout_s)))
        results = await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
    ok = [r for r in results if r.ok]
    itls = [x for r in ok for x in r.itls]
    return LevelResult(
        offered_rps=rate,
        sent_rps=len(results) / cfg.duration_s,
        num_requests=len(results),
        num_failed=len(results) - len(ok),
        wall_s=wall,
        achieved_rps=len(ok) / wall if wall else 0.0,
        output_tokens_per_s=sum(r.num_tokens for r in ok) / wall if wall else 0.0,
        ttft_p50=percentile([r.ttft for r in ok], 50),
        ttft_p99=percentile([r.ttft for r in ok], 99),
        itl_p50=percentile(itls, 50),
        itl_p99=percentile(itls, 99),
        e2e_p50=percentile([r.e2e for r in ok], 50),
    )


def plot(levels: list[LevelResult], knee: int | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = [lv.offered_rps for lv in levels]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax1.plot(loads, [lv.output_tokens_per_s for lv in levels], "o-", label="output tokens/s")
    ax1.set_xlabel("offered load (requests/s)")
    ax1.set_ylabel("output tokens/s")
    ax1.set_title("throughput")
    ax2.plot(loads, [lv.ttft_p50 * 1e3 for lv in levels], "o-", label="TTFT p50")
    ax2.plot(loads, [lv.ttft_p99 * 1e3 for lv in levels], "o--", label="TTFT p99")
    ax2.plot(loads, [lv.itl_p50 * 1e3 for lv in levels], "s-", label="ITL p50")
    ax2.plot(loads, [lv.itl_p99 * 1e3 for lv in levels], "s--", label="ITL p99")
    ax2.set_yscale("log")
    ax2.set_xlabel("offered load (requests/s)")
    ax2.set_ylabel("ms")
    ax2.set_title("latency")
    if knee is not None:
        for ax in (ax1, ax2):
            ax.axvline(loads[knee], color="red", linestyle=":", label=f"knee ({loads[knee]:g} req/s)")
    ax1.legend()
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _is_ready(httpx, url: str) -> bool:
    """`GET /ready` (the core is alive and stepping) where the server has the route,
    else `GET /health` (the process answers)."""
    ready = httpx.get(f"{url}/ready", timeout=1)
    if ready.status_code != 404:
        return ready.status_code == 200
    return httpx.get(f"{url}/health", timeout=1).status_code == 200


def start_server(model: str | None, extra: list[str], startup_timeout: float = 120.0) -> tuple[subprocess.Popen, str]:
    import httpx

    port = _free_port()
    cmd = [sys.executable, "-m", "inferd.agent.cli", "serve", "--port", str(port), "--log-level", "WARNING", *extra]
    if model:
        cmd += ["--model", model]
    proc = subprocess.Popen(cmd, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"inferd serve exited with {proc.returncode}")
        try:
            if _is_ready(httpx, url):
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError(f"inferd serve was not ready within {startup_timeout:g} s")


def stop_server(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM (the server drains), then SIGKILL if it has not exited within `timeout`."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="benchmark a running server (default: start one)")
    parser.add_argument("--model", help="checkpoint directory for the started server")
    parser.add_argument(
        "--preset",
        choices=["tiny", "small"],
        help="make-model preset for the started server "
        "(written under a temporary folder); default: the embedded tiny model",
    )
    parser.add_argument("--served-model-name", default=None, help="model name to request (default: the server's)")
    parser.add_argument(
        "--rates", default="1,2,4,8,16,32", help="offered loads, requests/s, rising (default 1,2,4,8,16,32)"
    )
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals per level (default 20)")
    parser.add_argument("--prompt-len", default="16,256", help="prompt length range in words, MIN,MAX (default 16,256)")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed of arrival times and prompt lengths")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra option for the started server, e.g. --server-arg=--max-num-seqs=32 (repeatable)",
    )
    parser.add_argument("--out", default="bench-serve", help="output prefix: PREFIX.json and PREFIX.png")


def run(args: argparse.Namespace) -> int:
    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        lo, hi = (int(x) for x in args.prompt_len.split(","))
        cfg = BenchConfig(
            rates=[float(x) for x in args.rates.split(",")],
            duration_s=args.duration,
            prompt_len_min=lo,
            prompt_len_max=hi,
            max_tokens=args.max_tokens,
            seed=args.seed,
        )
    except ValueError as exc:
        log.error("bad option: %s", exc)
        return 2
    proc = None
    url = args.url
    model = args.model
    if args.preset and not model:
        import tempfile

        from ..make_model import ModelSpec, make_model

        model = tempfile.mkdtemp(prefix=f"inferd-bench-{args.preset}-")
        make_model(model, ModelSpec(preset=args.preset))
    try:
        if url is None:
            proc, url = start_server(model, args.server_arg)
        url = url.rstrip("/")
        served = args.served_model_name or httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        rng = random.Random(cfg.seed)
        levels: list[LevelResult] = []
        for rate in cfg.rates:
            level = asyncio.run(run_level(url, served, rate, cfg, rng))
            levels.append(level)
            print(
                f"offered {rate:7.2f} req/s (sent {level.sent_rps:6.2f}): achieved {level.achieved_rps:6.2f} req/s, "
                f"{level.output_tokens_per_s:8.1f} tok/s, TTFT p50/p99 {level.ttft_p50 * 1e3:7.1f}/"
                f"{level.ttft_p99 * 1e3:7.1f} ms, ITL p50/p99 {level.itl_p50 * 1e3:6.1f}/{level.itl_p99 * 1e3:6.1f} ms, "
                f"failed {level.num_failed}/{level.num_requests}",
                flush=True,
            )
    finally:
        if proc is not None:
            stop_server(proc)
    knee = find_knee([lv.offered_rps for lv in levels], [lv.output_tokens_per_s for lv in levels])
    report = {
        "config": asdict(cfg),
        "url": url if args.url else "started",
        "model": served,
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "levels": [asdict(lv) for lv in levels],
        "knee": None if knee is None else {"index": knee, "offered_rps": levels[knee].offered_rps},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(report, indent=2, default=lambda x: None) + "\n")
    plot(levels, knee, Path(f"{out}.png"))
    print(
        f"knee: {'none found' if knee is None else f'{levels[knee].offered_rps:g} req/s'}; "
        f"wrote {out}.json and {out}.png"
    )
    return 1 if any(lv.num_failed for lv in levels) else 0
