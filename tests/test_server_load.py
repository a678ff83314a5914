"""Load on loopback: 200 requests, 32 at a time, half streaming, random lengths, a KV
pool small enough to force preemption (swap and recompute). Every request completes,
nothing is a 5xx, and every greedy or seeded request returns exactly what it returns
when sent alone. The second test does the same while the admin API retunes the
engine, flips fast/fallback and injects fast-path failures all along.

INFERD_SOAK_REQUESTS and INFERD_SOAK_CONCURRENCY make the first a longer soak
(e.g. 2000 and 64); CI runs the defaults."""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass

import httpx
import openai
import pytest

from inferd.engine.llm import LLM
from inferd.engine.request.sampling_params import SamplingParams

from server_fixtures import MODEL_NAME, admin_headers, metric_value, one_torch_thread, running_server, scrape  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

NUM_REQUESTS = int(os.environ.get("INFERD_SOAK_REQUESTS", 200))
CONCURRENCY = int(os.environ.get("INFERD_SOAK_CONCURRENCY", 32))
BLOCK_BYTES_TINY = 8192  # tiny preset, float32, block_size 16
SMALL_POOL = dict(kv_cache_bytes=48 * BLOCK_BYTES_TINY, swap_space_bytes=12 * BLOCK_BYTES_TINY, max_num_seqs=32)
WORDS = (
    "the engine keeps key value cache blocks sequence table batch step token memory host device "
    "scheduler prefix swap page fault model layer node socket link Hello world 0123456789"
).split()


@dataclass(slots=True)
class Job:
    prompt: str
    max_tokens: int
    temperature: float
    seed: int | None
    stream: bool

    @property
    def is_reproducible(self) -> bool:
        return self.temperature == 0.0 or self.seed is not None

    def params(self) -> SamplingParams:
        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, seed=self.seed)


def make_jobs(seed: int) -> list[Job]:
    rng = random.Random(seed)
    jobs = []
    for i in range(NUM_REQUESTS):
        kind = i % 4  # greedy, greedy, seeded sample, unseeded sample
        jobs.append(
            Job(
                prompt=" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 90))),
                max_tokens=rng.randint(4, 48),
                temperature=0.0 if kind < 2 else 0.9,
                seed=rng.randrange(1 << 30) if kind == 2 else None,
                stream=rng.random() < 0.5,
            )
        )
    return jobs


def alone(model_dir: str, jobs: list[Job]) -> dict[int, str]:
    """Each reproducible job run by itself on an engine with a roomy KV pool."""
    llm = LLM(model_dir, kv_cache_bytes=8 << 20)
    return {
        i: llm.generate(job.prompt, job.params())[0].outputs[0].text
        for i, job in enumerate(jobs)
        if job.is_reproducible
    }


async def send(client: openai.AsyncOpenAI, job: Job) -> tuple[str, str]:
    kwargs = dict(
        model=MODEL_NAME, prompt=job.prompt, max_tokens=job.max_tokens, temperature=job.temperature, seed=job.seed
    )
    if not job.stream:
        r = await client.completions.create(**kwargs)
        return r.choices[0].text, r.choices[0].finish_reason
    text, finish = "", None
    stream = await client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
    return text, finish


async def run_load(url: str, jobs: list[Job]) -> list[tuple[str, str] | BaseException]:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(job: Job):
        async with gate:
            return await send(client, job)

    try:
        return await asyncio.gather(*(one(j) for j in jobs), return_exceptions=True)
    finally:
        await client.close()


def check(url: str, jobs: list[Job], results, expected: dict[int, str]) -> None:
    failures = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
    assert not failures, f"{len(failures)} requests failed, first: {failures[0]!r}"
    assert all(finish in ("stop", "length") for _, finish in results)
    mismatched = [i for i, text in expected.items() if results[i][0] != text]
    assert not mismatched, (
        f"{len(mismatched)} of {len(expected)} reproducible requests differ from their solo run, "
        f"first #{mismatched[0]}: {results[mismatched[0]][0]!r} != {expected[mismatched[0]]!r}"
    )
    text = scrape(url)
    assert metric_value(text, "vllm:num_preemptions_total") > 0, "the KV pool did not force any preemption"
    assert metric_value(text, "inferd_kv_page_faults_total") > 0
    assert metric_value(text, "vllm:request_success_total") >= NUM_REQUESTS
    assert metric_value(text, "vllm:num_requests_running") == 0
    assert metric_value(text, "inferd_kv_blocks", {"state": "used"}) == 0
    assert metric_value(text, "http_requests_total", {"handler": "/v1/completions", "status": "2xx"}) == NUM_REQUESTS
    with pytest.raises(KeyError):
        metric_value(text, "http_requests_total", {"status": "5xx"})


def test_load_with_preemption(tiny_model):
    jobs = make_jobs(seed=1)
    expected = alone(tiny_model, jobs)
    with running_server(tiny_model, **SMALL_POOL) as server:
        results = asyncio.run(run_load(server.url, jobs))
        check(server.url, jobs, results, expected)
        text = scrape(server.url)
        # Both kinds of KV page fault happen with this pool: swap until the host pool fills, then recompute.
        assert metric_value(text, "inferd_kv_page_faults_total", {"kind": "swap_in"}) > 0
        assert metric_value(text, "inferd_kv_swap_bytes_total", {"direction": "out"}) > 0
        assert metric_value(text, "inferd_kv_swap_seconds_total") > 0
        # Every swapped-out block came back or was freed.
        assert metric_value(text, "inferd_kv_swap_pool_blocks", {"state": "used"}) == 0


ADMIN_CHANGES = [
    ("PATCH", "/config", {"max_num_seqs": 4}),
    ("POST", "/mode", {"mode": "fallback"}),
    ("PATCH", "/config", {"max_num_batched_tokens": 32}),
    ("PATCH", "/config", {"preemption_mode": "recompute"}),
    ("POST", "/mode", {"mode": "fast"}),
    ("POST", "/fault", {"kind": "fastpath"}),
    ("PATCH", "/config", {"max_num_seqs": 32, "max_num_batched_tokens": 2048}),
    ("PATCH", "/config", {"swap_space_bytes": 4 * BLOCK_BYTES_TINY}),
    ("PATCH", "/config", {"preemption_mode": "swap", "swap_space_bytes": 12 * BLOCK_BYTES_TINY}),
    ("POST", "/mode", {"mode": "fast"}),
]


async def churn_admin(url: str, stop: asyncio.Event) -> list[tuple[dict, int, str]]:
    log = []
    async with httpx.AsyncClient(base_url=f"{url}/admin", headers=admin_headers(), timeout=60) as http:
        i = 0
        while not stop.is_set():
            method, path, body = ADMIN_CHANGES[i % len(ADMIN_CHANGES)]
            r = await http.request(method, path, json=body)
            log.append((body, r.status_code, r.text))
            i += 1
            await asyncio.sleep(0.05)
    return log


def test_load_with_admin_changes_and_mode_switches(tiny_model):
    jobs = make_jobs(seed=2)
    expected = alone(tiny_model, jobs)
    with running_server(tiny_model, enable_fault_injection=True, **SMALL_POOL) as server:

        async def scenario():
            stop = asyncio.Event()
            churn = asyncio.create_task(churn_admin(server.url, stop))
            try:
                results = await run_load(server.url, jobs)
            finally:
                stop.set()
            return results, await churn

        results, log = asyncio.run(scenario())
        check(server.url, jobs, results, expected)
        assert len(log) >= 2 * len(ADMIN_CHANGES), f"only {len(log)} admin calls during the load"
        for body, status, text in log:
            # Shrinking the host pool below what swapped-out sequences hold is refused, by design.
            shrink_refused = status == 422 and "in use by swapped-out sequences" in text
            assert status == 200 or shrink_refused, (body, status, text)
        metrics = scrape(server.url)
        assert metric_value(metrics, "inferd_engine_fastpath_failures_total") >= 2


def test_several_hundred_concurrent_streams(tiny_model):
    num_streams = 300

    async def scenario(url: str):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300)
        opened = asyncio.Event()
        waiting = {"n": num_streams}

        async def one(i: int) -> int:
            stream = await client.completions.create(
                model=MODEL_NAME,
                prompt=f"stream {i} of many",
                max_tokens=6,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
                stream_options={"include_usage": True},
            )
            # Hold every stream open until all of them are: they are served side by side.
            waiting["n"] -= 1
            if waiting["n"] == 0:
                opened.set()
            await opened.wait()
            usage = None
            async for chunk in stream:
                usage = chunk.usage or usage
            return usage.completion_tokens

        try:
            return await asyncio.gather(*(one(i) for i in range(num_streams)))
        finally:
            await client.close()

    with running_server(tiny_model, max_num_seqs=256) as server:
        tokens = asyncio.run(scenario(server.url))
        assert tokens == [6] * num_streams
        text = scrape(server.url)
        assert metric_value(text, "vllm:request_success_total", {"finished_reason": "length"}) == num_streams
        assert metric_value(text, "inferd_scheduler_batch_size_bucket", {"le": "64.0"}) < metric_value(
            text, "inferd_scheduler_batch_size_count"
        ), "never more than 64 sequences in one step"
