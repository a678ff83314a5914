"""What `inferd bench serve` sends and when: Poisson and gamma arrivals, trace replay,
ShareGPT JSON and JSONL parsing and filtering, ShareGPT-like synthetic lengths, and the
request bodies and their timing by the streaming client (against httpx's mock transport)."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
from pathlib import Path

import httpx
import pytest

from inferd.engine.bench import datasets
from inferd.engine.bench.arrivals import gamma_times, parse_trace, poisson_times, read_trace, trace_rate, trace_times
from inferd.engine.bench.datasets import SampleRequest, parse_sharegpt, read_sharegpt
from inferd.engine.bench.goodput import RequestRecord
from inferd.engine.bench.serve_client import completion_body, plain_sampling, send
from inferd.engine.bench.token_count import TokenCounter, estimate_tokens

FIXTURES = Path(__file__).parent / "fixtures" / "bench_serve"


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *times], times)]


def cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs)


# --- arrivals ------------------------------------------------------------------------------
def test_poisson_arrivals_send_rate_x_duration_requests_at_exponential_gaps():
    times = poisson_times(5.0, 400.0, random.Random(0))
    assert len(times) == 2000 and times == sorted(times) and 0 <= times[0] and times[-1] < 400.0
    assert statistics.fmean(gaps(times)) == pytest.approx(0.2, rel=0.05)
    assert cv(gaps(times)) == pytest.approx(1.0, abs=0.1)  # exponential gaps
    # the mean rate holds in each half, not only over the whole level
    assert sum(t < 200 for t in times) / 200 == pytest.approx(5.0, rel=0.1)
    assert len(poisson_times(0.1, 2.0, random.Random(0))) == 1  # at least one request a level
    assert times == poisson_times(5.0, 400.0, random.Random(0))


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_keep_the_mean_rate_and_set_the_spread(burstiness):
    times = gamma_times(5.0, 400.0, burstiness, random.Random(0))
    assert len(times) == 2000 and times == sorted(times)
    assert times[-1] == pytest.approx(400.0)  # scaled so the level's mean rate is exact
    assert statistics.fmean(gaps(times)) == pytest.approx(0.2, rel=1e-9)
    assert sum(t < 200 for t in times) / 200 == pytest.approx(5.0, rel=0.15)
    assert cv(gaps(times)) == pytest.approx(1 / burstiness**0.5, rel=0.15)  # gamma: CV = 1/sqrt(shape)


def test_lower_burstiness_means_burstier_arrivals():
    spread = {b: statistics.pvariance(gaps(gamma_times(5.0, 200.0, b, random.Random(3)))) for b in (0.25, 1.0, 4.0)}
    assert spread[0.25] > 2 * spread[1.0] > 4 * spread[4.0]
    with pytest.raises(ValueError, match="burstiness"):
        gamma_times(1.0, 1.0, 0.0, random.Random(0))


# --- traces --------------------------------------------------------------------------------
def test_trace_replays_its_timestamps_and_carries_lengths_and_classes():
    entries = read_trace(FIXTURES / "trace.jsonl")
    assert [e.timestamp for e in entries] == [100.0, 100.25, 100.5, 101.5, 102.0]  # sorted, blank line skipped
    assert (entries[0].prompt_len, entries[0].output_len, entries[0].slo_class) == (12, 5, "interactive")
    assert (entries[1].prompt_len, entries[1].slo_class) == (30, "batch")
    assert (entries[2].prompt_len, entries[2].output_len, entries[2].slo_class) == (None, None, None)
    assert entries[3].output_len == 7
    assert trace_times(entries) == [0.0, 0.25, 0.5, 1.5, 2.0]
    assert trace_rate(entries) == pytest.approx(5 / 2.0)
    assert trace_times(entries, rate=5.0) == pytest.approx([0.0, 0.125, 0.25, 0.75, 1.0])  # twice as fast


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"timestamp": 1}', "{nope"], "line 2: not JSON"),
        (['{"timestamp": 1}', '{"time": 2}'], "line 2: needs a numeric timestamp"),
        (['{"timestamp": 1}', '{"timestamp": 2, "prompt_len": 0}'], "prompt_len must be an integer >= 1"),
        (['{"timestamp": 1}', '{"timestamp": 2, "class": 3}'], "class must be a string"),
        (['{"timestamp": 1}'], "at least two entries"),
        (['{"timestamp": 1}', '{"timestamp": 1}'], "different timestamps"),
        (["[1, 2]", '{"timestamp": 1}'], "expected an object"),
    ],
)
def test_trace_refuses_bad_lines_naming_them(lines, message):
    with pytest.raises(ValueError, match=message):
        parse_trace(lines, "t.jsonl")


# --- datasets ------------------------------------------------------------------------------
async def words(text: str, add_special_tokens: bool) -> int:
    """A stand-in tokenizer: a token a word, and a BOS on prompts."""
    return len(text.split()) + int(add_special_tokens)


def test_sharegpt_json_and_jsonl_give_the_same_first_exchanges():
    pairs = read_sharegpt(FIXTURES / "sharegpt.json")
    assert pairs == read_sharegpt(FIXTURES / "sharegpt.jsonl")
    prompts = [p for p, _ in pairs]
    assert len(pairs) == 5  # the entry with no gpt reply is left out
    assert prompts[0].startswith("How do I keep a sourdough") and pairs[0][1].startswith("Feed it well")
    assert prompts[2].startswith("Name three rivers")  # the system turn before it is skipped
    assert prompts[3].startswith("What can I cook")  # a gpt turn before the first human one is skipped
    assert not any(p.startswith("Write the opening line") for p in prompts)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "neither a JSON list nor JSON lines"),
        ('{"a": 1}', "no entry has a human turn"),
        ("[]", "no entry has a human turn"),
        ('{"conversations": [{"from": "gpt", "value": "x"}]}', "no entry has a human turn"),
    ],
)
def test_sharegpt_refuses_what_is_not_sharegpt(text, message):
    with pytest.raises(ValueError, match=message):
        parse_sharegpt(text, "d.json")


def test_sharegpt_requests_are_filtered_as_vllm_filters_and_repeat_when_short():
    pairs = read_sharegpt(FIXTURES / "sharegpt.json")
    got = asyncio.run(datasets.sharegpt_requests(pairs, 7, words, random.Random(0), max_model_len=2048))
    assert len(got) == 7
    kept = {s.prompt.split()[0] for s in got}
    # "hi" (a 2-token prompt) and the "Bzz." reply (1 token) are too short
    assert kept == {"How", "Name", "What"}
    first = next(s for s in got if s.prompt.startswith("Name three"))
    assert (first.prompt_len, first.output_len) == (12, 7)
    assert got[3:6] == got[0:3]  # repeated in the same order once the file runs out
    assert got == asyncio.run(datasets.sharegpt_requests(pairs, 7, words, random.Random(0), max_model_len=2048))
    # a context of 30 tokens leaves out the two long exchanges (prompt + reply of 48 and 39)
    short = asyncio.run(datasets.sharegpt_requests(pairs, 2, words, random.Random(0), max_model_len=30))
    assert {s.prompt.split()[0] for s in short} == {"Name"}
    with pytest.raises(ValueError, match="no entry fits"):
        asyncio.run(datasets.sharegpt_requests(pairs, 2, words, random.Random(0), max_model_len=10))


def test_synthetic_lengths_are_sharegpt_like_after_the_filter():
    got = asyncio.run(datasets.synthetic_requests(3000, words, 1.0, random.Random(0), max_model_len=2048))
    prompts, outputs = [s.prompt_len for s in got], [s.output_len for s in got]
    assert all(datasets.fits(p, o, 2048) for p, o in zip(prompts, outputs))
    # the means the parameters were fitted to (230 and 203 tokens a request), and the medians they give
    assert statistics.fmean(prompts) == pytest.approx(230, rel=0.08)
    assert statistics.fmean(outputs) == pytest.approx(203, rel=0.08)
    assert statistics.median(prompts) == pytest.approx(153, rel=0.1)
    assert statistics.median(outputs) == pytest.approx(138, rel=0.1)
    assert max(prompts) <= datasets.MAX_PROMPT_LEN and min(outputs) >= datasets.MIN_LEN
    small = asyncio.run(datasets.synthetic_requests(50, words, 1.0, random.Random(0), max_model_len=256))
    assert all(s.prompt_len + s.output_len <= 256 for s in small)


def test_uniform_requests_keep_the_old_sweep():
    got = asyncio.run(datasets.uniform_requests(20, (4, 8), 16, words, random.Random(0)))
    assert all(4 <= len(s.prompt.split()) <= 8 and s.output_len == 16 for s in got)
    assert all(s.prompt_len == len(s.prompt.split()) + 1 for s in got)


# --- the client ----------------------------------------------------------------------------
def sse(*chunks: dict) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def exchange(handler, body: dict | None = None) -> RequestRecord:
    async def go() -> RequestRecord:
        record = RequestRecord("c", prompt_len=3)
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await send(client, "http://bench", body or {}, record, timeout=5)
        return record

    return asyncio.run(go())


def test_client_times_a_stream_and_takes_the_servers_token_count():
    text = [{"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]}, {"choices": [{"text": "c"}]}]
    usage = {"choices": [], "usage": {"completion_tokens": 3}}
    record = exchange(lambda request: httpx.Response(200, content=sse(*text, usage)))
    assert record.is_completed and record.num_output_tokens == 3 and len(record.itls) == 2
    assert 0 < record.ttft <= record.e2e and record.tpot is not None
    no_usage = exchange(lambda request: httpx.Response(200, content=sse(*text)))
    assert no_usage.num_output_tokens == 3  # a token a chunk when the server sends no usage


def test_client_tells_shed_from_failed():
    shed = exchange(lambda request: httpx.Response(429, json={"error": {"message": "busy"}}))
    assert shed.is_shed and not shed.is_completed and shed.status == 429 and shed.e2e >= 0
    assert shed.error.startswith("HTTP 429")
    failed = exchange(lambda request: httpx.Response(400, json={"error": {"message": "too long"}}))
    assert not failed.is_shed and not failed.is_completed and "too long" in failed.error
    broken = exchange(
        lambda request: httpx.Response(200, content=sse({"choices": [{"text": "a"}]}, {"error": {"message": "oops"}}))
    )
    assert not broken.is_completed and broken.error == "stream error: oops"
    empty = exchange(lambda request: httpx.Response(200, content=b"data: [DONE]\n\n"))
    assert not empty.is_completed and "no token" in empty.error

    def refuse(request):
        raise httpx.ConnectError("refused")

    gone = exchange(refuse)
    assert gone.status == 0 and not gone.is_shed and gone.error.startswith("ConnectError")


def test_request_body_carries_the_class_only_when_asked():
    sample = SampleRequest("some words", 3, 12)
    plain = completion_body("m", sample, {"temperature": 0.0})
    assert "slo_class" not in plain and plain["max_tokens"] == 12 and plain["stream"] is True
    assert plain["prompt"] == "some words" and plain["stream_options"] == {"include_usage": True}
    sent = completion_body(
        "m", sample, plain_sampling({"temperature": 0.7, "top_p": 1.0, "top_k": 0, "min_p": 0.0}), "chat"
    )
    assert sent["slo_class"] == "chat" and sent["temperature"] == 0.7
    assert "top_k" not in sent and "top_p" not in sent and "min_p" not in sent  # off values stay off the wire
    assert plain_sampling({"temperature": 1.0, "top_p": 0.9, "top_k": 50}) == {
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": 50,
    }


def test_token_counter_uses_tokenize_where_the_server_has_it():
    def server(request):
        if request.url.path != "/tokenize":
            return httpx.Response(404)
        prompt = json.loads(request.content)["prompt"]
        return httpx.Response(200, json={"count": 2 * len(prompt.split()), "tokens": [], "max_model_len": 64})

    async def go(handler) -> tuple[TokenCounter, int]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            counter = TokenCounter(client, "http://bench", "m")
            await counter.start("one two three four")
            return counter, await counter.count("five six seven")

    counter, n = asyncio.run(go(server))
    assert counter.is_exact and counter.tokens_per_word == 2.0 and n == 6
    counter, n = asyncio.run(go(lambda request: httpx.Response(404)))
    assert not counter.is_exact and counter.source == "whitespace estimate" and n == estimate_tokens("a b c") == 4
