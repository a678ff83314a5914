"""`inferd bench serve`: the server at rising offered loads, judged on goodput.

For each offered load it sends streaming completions at the arrival times of
arrivals.py (Poisson by default, gamma with --burstiness, or a replayed trace) with
the prompts and output lengths of datasets.py (ShareGPT-like synthetic lengths by
default, a ShareGPT file, or uniform), each request in an SLO class (slo_classes.py)
and greedy or sampled (--sampled-share). Per level, and per class beside it
(goodput.py): goodput and SLO attainment, achieved request and token throughput,
TTFT/TPOT/ITL/end-to-end latency, shed (429/503) and failed requests, under
`vllm bench serve`'s JSON keys where it has them. The knee is where throughput stops
growing while latency climbs: the level where the slope of throughput over offered
load drops the most (inferd/knee.py). Writes PREFIX.json and PREFIX.png.

Without --url it starts `inferd serve` in a subprocess on a free loopback port (the
embedded tiny model unless --model or --preset says otherwise) and stops it after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import random
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from inferd.knee import find_knee

from ..model.make_model import ModelSpec, make_model
from .arrivals import TraceEntry, read_trace
from .datasets import WORDS, read_sharegpt
from .goodput import percentile
from .serve_config import DEFAULT_MAX_MODEL_LEN, BenchConfig
from .serve_levels import level_report, make_samples, plan_levels, run_level, with_trace_lengths
from .serve_options import OptionError, add_arguments, config_from_args, fail
from .serve_plot import plot
from .token_count import CALIBRATION_WORDS, TokenCounter

__all__ = ["BenchConfig", "add_arguments", "find_knee", "percentile", "run", "start_server", "stop_server"]

log = logging.getLogger(__name__)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_level(level: dict[str, Any]) -> None:
    goodput = level["request_goodput"]
    slo = "" if goodput is None else f"goodput {goodput:6.2f} req/s (attainment {level['attainment']:.2f}), "
    print(
        f"offered {level['offered_rate']:7.2f} req/s: achieved {level['request_throughput']:6.2f} req/s, {slo}"
        f"{level['output_throughput']:8.1f} tok/s, TTFT p50/p99 {_ms(level['median_ttft_ms'])}/"
        f"{_ms(level['p99_ttft_ms'])} ms, TPOT p50/p99 {_ms(level['median_tpot_ms'])}/{_ms(level['p99_tpot_ms'])} ms, "
        f"shed {level['shed']['count']}, failed {level['failed']}/{level['num_requests']}",
        flush=True,
    )
    if goodput is None or len(level["per_class"]) < 2:
        return
    for name, c in level["per_class"].items():
        print(
            f"    {name:>12}: goodput {c['request_goodput']:6.2f} req/s, attainment {_ratio(c['attainment'])} "
            f"(of admitted {_ratio(c['attainment_of_admitted'])}), TTFT p99 {_ms(c['p99_ttft_ms'])} ms, "
            f"TPOT p99 {_ms(c['p99_tpot_ms'])} ms, shed {c['shed']['count']}, failed {c['failed']}",
            flush=True,
        )


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


async def _model_card(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    """The first model of `GET /v1/models` (its `id`, and `max_model_len` where the
    server says it, as vLLM and ours do); empty when the route does not answer."""
    try:
        response = await client.get(f"{url}/v1/models", timeout=10)
        cards = response.json().get("data") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return {}
    return cards[0] if isinstance(cards, list) and cards and isinstance(cards[0], dict) else {}


async def bench(
    url: str,
    served_model_name: str | None,
    cfg: BenchConfig,
    pairs: list[tuple[str, str]] | None,
    trace: list[TraceEntry] | None,
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits) as client:
        card = await _model_card(client, url)
        model = served_model_name or card.get("id")
        if not model:
            raise RuntimeError(f"{url}/v1/models names no model; give --served-model-name")
        max_model_len = cfg.max_model_len or card.get("max_model_len") or DEFAULT_MAX_MODEL_LEN
        counter = TokenCounter(client, url, model)
        await counter.start(" ".join(WORDS[i % len(WORDS)] for i in range(CALIBRATION_WORDS)))
        plans = plan_levels(cfg, trace)
        samples = await make_samples(cfg, pairs, sum(len(p.times) for p in plans), counter, max_model_len)
        rng = random.Random(f"{cfg.seed}:classes")
        levels, first = [], 0
        for plan in plans:
            level_samples = samples[first : first + len(plan.times)]
            first += len(plan.times)
            if plan.trace is not None:
                level_samples = await with_trace_lengths(level_samples, plan.trace, counter, cfg.seed)
            records, wall = await run_level(client, url, model, cfg, plan, level_samples, rng)
            levels.append(level_report(plan, cfg, records, wall))
            print_level(levels[-1])
    return {
        "model": model,
        "requests": {"token_counts": counter.source, "max_model_len": max_model_len},
        "levels": levels,
    }


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


def _read_inputs(cfg: BenchConfig) -> tuple[list[tuple[str, str]] | None, list[TraceEntry] | None]:
    """The dataset file and the trace, read before any server starts."""
    pairs = trace = None
    if cfg.dataset not in ("synthetic", "uniform"):
        try:
            pairs = read_sharegpt(cfg.dataset)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise OptionError("--dataset", str(exc)) from None
    if cfg.trace is not None:
        try:
            trace = read_trace(cfg.trace)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise OptionError("--trace", str(exc)) from None
        names = {c.name for c in cfg.classes}
        unknown = sorted({e.slo_class for e in trace if e.slo_class is not None} - names)
        if unknown:
            raise OptionError("--trace", f"class {', '.join(unknown)} is not one of {', '.join(sorted(names))}")
    return pairs, trace


def run(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        cfg = config_from_args(args)
        pairs, trace = _read_inputs(cfg)
    except ValueError as exc:
        fail(args, exc)
    proc = None
    url = args.url
    model = args.model
    if args.preset and not model:
        import tempfile

        model = tempfile.mkdtemp(prefix=f"inferd-bench-{args.preset}-")
        make_model(model, ModelSpec(preset=args.preset))
    try:
        if url is None:
            proc, url = start_server(model, args.server_arg)
        url = url.rstrip("/")
        result = asyncio.run(bench(url, args.served_model_name, cfg, pairs, trace))
    finally:
        if proc is not None:
            stop_server(proc)
    levels = result["levels"]
    knee = find_knee([lv["offered_rate"] for lv in levels], [lv["output_throughput"] for lv in levels])
    report = {
        "config": asdict(cfg),
        "url": url if args.url else "started",
        "model": result["model"],
        "requests": result["requests"],
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "levels": levels,
        "knee": None if knee is None else {"index": knee, "offered_rate": levels[knee]["offered_rate"]},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(report, indent=2, default=lambda x: None) + "\n")
    plot(levels, knee, Path(f"{out}.png"), frozenset(c.name for c in cfg.classes if c.is_best_effort))
    found = "none found" if knee is None else f"{levels[knee]['offered_rate']:g} req/s"
    print(f"knee: {found}; wrote {out}.json and {out}.png")
    return 1 if any(lv["failed"] for lv in levels) else 0
