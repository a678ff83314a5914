"""The levels of `inferd bench serve`: when each request of a level is sent, what it
asks for, in which class and with which sampling; sending them on time; the level's
report (goodput.py's keys, and those `inferd doctor --sweep` reads)."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from .arrivals import TraceEntry, gamma_times, poisson_times, trace_rate, trace_times
from .datasets import SampleRequest, sharegpt_requests, sized_prompt, synthetic_requests, uniform_requests
from .goodput import RequestRecord, summarize_level
from .serve_client import completion_body, plain_sampling, send
from .serve_config import BenchConfig
from .slo_classes import assign_classes
from .token_count import TokenCounter


@dataclass(slots=True)
class LevelPlan:
    offered_rate: float
    times: list[float]  # seconds from the level's start
    trace: list[TraceEntry] | None = None


def plan_levels(cfg: BenchConfig, trace: list[TraceEntry] | None) -> list[LevelPlan]:
    rng = random.Random(f"{cfg.seed}:arrivals")
    if trace is not None:
        if cfg.rates is None:
            return [LevelPlan(trace_rate(trace), trace_times(trace), trace)]
        return [LevelPlan(rate, trace_times(trace, rate), trace) for rate in cfg.rates]
    assert cfg.rates is not None
    if cfg.arrival == "gamma":
        return [LevelPlan(r, gamma_times(r, cfg.duration_s, cfg.burstiness, rng)) for r in cfg.rates]
    return [LevelPlan(r, poisson_times(r, cfg.duration_s, rng)) for r in cfg.rates]


async def make_samples(
    cfg: BenchConfig, pairs: list[tuple[str, str]] | None, num: int, counter: TokenCounter, max_model_len: int
) -> list[SampleRequest]:
    rng = random.Random(f"{cfg.seed}:dataset")
    if pairs is not None:
        samples = await sharegpt_requests(pairs, num, counter.count, rng, max_model_len)
    elif cfg.dataset == "uniform":
        words = (cfg.prompt_len_min, cfg.prompt_len_max)
        return await uniform_requests(num, words, cfg.uniform_output_len, counter.count, rng)
    else:
        samples = await synthetic_requests(num, counter.count, counter.tokens_per_word, rng, max_model_len)
    if cfg.max_tokens is not None:
        samples = [SampleRequest(s.prompt, s.prompt_len, min(s.output_len, cfg.max_tokens)) for s in samples]
    return samples


async def with_trace_lengths(
    samples: list[SampleRequest], trace: list[TraceEntry], counter: TokenCounter, seed: int
) -> list[SampleRequest]:
    """A trace line's prompt_len and output_len win over the dataset's."""
    rng = random.Random(f"{seed}:trace")
    out = []
    for sample, entry in zip(samples, trace):
        prompt, prompt_len = sample.prompt, sample.prompt_len
        if entry.prompt_len is not None:
            prompt, prompt_len = await sized_prompt(entry.prompt_len, counter.count, counter.tokens_per_word, rng)
        out.append(SampleRequest(prompt, prompt_len, entry.output_len or sample.output_len))
    return out


async def run_level(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    cfg: BenchConfig,
    plan: LevelPlan,
    samples: list[SampleRequest],
    rng: random.Random,
) -> tuple[list[RequestRecord], float]:
    n = len(plan.times)
    classes = assign_classes(n, cfg.classes, rng)
    if plan.trace is not None:
        classes = [e.slo_class or c for e, c in zip(plan.trace, classes)]
    sampling = [plain_sampling(p) for p in cfg.sampling.request_params(n)]
    records = [RequestRecord(c, s.prompt_len) for c, s in zip(classes, samples)]
    bodies = [
        completion_body(model, s, p, c if cfg.send_slo_class else None) for s, p, c in zip(samples, sampling, classes)
    ]
    tasks = []
    start = time.perf_counter()
    for t, body, record in zip(plan.times, bodies, records):
        delay = start + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(client, url, body, record, cfg.timeout_s)))
    await asyncio.gather(*tasks)
    return records, time.perf_counter() - start


def level_report(plan: LevelPlan, cfg: BenchConfig, records: list[RequestRecord], wall: float) -> dict[str, Any]:
    level: dict[str, Any] = {"offered_rate": plan.offered_rate, "duration": wall}
    level.update(summarize_level(records, cfg.classes, wall))
    level["errors"] = sorted({r.error for r in records if r.error and not r.is_shed})[:5]
    # The keys `inferd doctor --sweep` reads (agent/doctor/saturation.py), seconds.
    p99_ttft, p99_itl = level["p99_ttft_ms"], level["p99_itl_ms"]
    level["offered_rps"] = plan.offered_rate
    level["output_tokens_per_s"] = level["output_throughput"]
    level["ttft_p99"] = None if p99_ttft is None else p99_ttft / 1e3
    level["itl_p99"] = None if p99_itl is None else p99_itl / 1e3
    return level
