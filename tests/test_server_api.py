"""The OpenAI-compatible API through the official `openai` client against a real
uvicorn server on loopback (tiny random model)."""

from __future__ import annotations

import functools
import re
import threading
import time

import httpx
import openai
import pytest

from server_fixtures import MODEL_NAME, running_server


@pytest.fixture(scope="module")
def server(tiny_model):
    with running_server(tiny_model) as s:
        yield s


@pytest.fixture(scope="module")
def client(server, tiny_model):
    c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    c._inferd_model_dir = tiny_model
    return c


def greedy(client, prompt: str, max_tokens: int = 24, **kw):
    return client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0, **kw)


def test_models_and_health(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_completion(client):
    r = client.completions.create(
        model=MODEL_NAME,
        prompt="The engine keeps the key",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert r.object == "text_completion"
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    assert choice.text  # 12 tokens of a random model decode to something
    again = greedy(client, "The engine keeps the key", max_tokens=12, extra_body={"ignore_eos": True})
    assert again.choices[0].text == choice.text


def test_chat(client):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello, world!"}]
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=10, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant"
    assert r.usage.completion_tokens == 10
    # The checkpoint's template renders both messages; a longer history means a longer prompt.
    r2 = client.chat.completions.create(model=MODEL_NAME, messages=messages[1:], max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens > r2.usage.prompt_tokens
    # max_completion_tokens is the newer name of max_tokens.
    r3 = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_completion_tokens=10, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r3.choices[0].message.content == msg.content


def test_streaming_with_usage_matches_non_streaming(client):
    prompt = "Continuous batching admits new requests"
    expected = greedy(client, prompt, max_tokens=20, extra_body={"ignore_eos": True})
    chunks = list(
        client.completions.create(
            model=MODEL_NAME,
            prompt=prompt,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == expected.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == expected.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_streaming(client):
    messages = [{"role": "user", "content": "Once upon a time"}]
    expected = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=messages,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == expected.usage.completion_tokens


def test_streaming_without_usage_sends_none(client):
    chunks = list(client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=4, stream=True, temperature=0))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason is not None


def test_n2(client):
    r = client.completions.create(
        model=MODEL_NAME,
        prompt="A prefix cache hashes",
        max_tokens=16,
        n=2,
        temperature=1.0,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.usage.completion_tokens == 32
    assert r.choices[0].text != r.choices[1].text  # two independent samples
    chunks = list(
        client.completions.create(
            model=MODEL_NAME,
            prompt="A prefix cache hashes",
            max_tokens=16,
            n=2,
            temperature=1.0,
            seed=7,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    streamed = {0: "", 1: ""}
    for c in chunks:
        for choice in c.choices:
            streamed[choice.index] += choice.text
    assert streamed == {c.index: c.text for c in r.choices}
    assert chunks[-1].usage.completion_tokens == 32


def test_stop_strings(client):
    prompt = "GPUs read every weight once per decoded token"
    full = greedy(client, prompt, max_tokens=40, extra_body={"ignore_eos": True}).choices[0].text
    words = re.findall(r"[A-Za-z]{3,}", full)
    assert len(words) >= 2, f"no usable stop word in {full!r}"
    stop = words[len(words) // 2]
    expected = full[: full.find(stop)]
    r = greedy(client, prompt, max_tokens=40, stop=[stop], extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == expected
    assert r.choices[0].model_extra.get("stop_reason") == stop
    # Streaming must not leak any part of the stop string.
    chunks = list(
        client.completions.create(
            model=MODEL_NAME,
            prompt=prompt,
            max_tokens=40,
            temperature=0,
            stop=stop,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected


def test_seed_reproducibility(client):
    def sample(seed):
        return (
            client.completions.create(
                model=MODEL_NAME,
                prompt="Prometheus scrapes metrics",
                max_tokens=16,
                temperature=1.0,
                seed=seed,
                extra_body={"ignore_eos": True},
            )
            .choices[0]
            .text
        )

    a, b, c = sample(1234), sample(1234), sample(4321)
    assert a == b
    assert a != c


def test_completion_logprobs(client):
    r = greedy(client, "NUMA nodes own memory", max_tokens=8, logprobs=3, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0.0
        assert len(top) >= 2  # three top tokens; two may decode to the same text
        assert chosen == pytest.approx(max(top.values()))  # greedy picks the most likely token


def test_chat_logprobs(client):
    r = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.bytes == list(entry.token.encode())


def test_token_id_prompt_and_batch(client):
    text = greedy(client, "Hello, world!", max_tokens=6).choices[0].text
    ids = greedy(client, "Hello, world!", max_tokens=1, logprobs=0).usage.prompt_tokens
    assert ids > 0
    r = client.completions.create(
        model=MODEL_NAME, prompt=["Hello, world!", "Once upon a time"], max_tokens=6, temperature=0
    )
    choices = sorted(r.choices, key=lambda c: c.index)
    assert [c.index for c in choices] == [0, 1]
    assert choices[0].text == text
    # A prompt given as token ids gives the same result as its text.
    from inferd.engine.text.tokenizer import Tokenizer

    tok = Tokenizer(client._inferd_model_dir)
    by_ids = client.completions.create(
        model=MODEL_NAME, prompt=tok.encode("Hello, world!"), max_tokens=6, temperature=0
    )
    assert by_ids.choices[0].text == text


def gated_engine(gate: str, config):
    """An engine whose steps wait while the file `gate` exists (built in the engine core
    process); requests that arrive meanwhile reach the scheduler together."""
    import os
    import time

    from inferd.engine.llm_engine import LLMEngine

    engine = LLMEngine(config)
    real_step = engine.step

    def step():
        while os.path.exists(gate):
            time.sleep(0.01)
        return real_step()

    engine.step = step
    return engine


def test_priority_orders_admission(tiny_model, tmp_path):
    """One sequence slot. A first request's step waits at a gate; a priority-5 request and
    then a priority-0 one arrive meanwhile. When the gate opens, the priority-0 request runs
    first (lower is earlier, as in vLLM): the priority-5 one gets its first token only after
    the other's 32 (the blocker, priority 0 and older, has finished by then whichever way the
    core received it: alone, or with the others and admitted first)."""
    gate = tmp_path / "gate"
    factory = functools.partial(gated_engine, str(gate))
    with running_server(tiny_model, max_num_seqs=1, engine_factory=factory) as server:
        url = f"{server.url}/v1/completions"
        live = server.app.state.engine
        firsts, errors = [], []

        def send(name: str, priority: int, max_tokens: int) -> None:
            body = {
                "model": MODEL_NAME,
                "prompt": f"{name} priority",
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "priority": priority,
            }
            try:
                with httpx.stream("POST", url, json=body, timeout=60) as r:
                    assert r.status_code == 200, r.read()
                    chunks = r.iter_lines()
                    assert next(line for line in chunks if line.startswith("data: {"))
                    if name != "blocker":
                        firsts.append(name)
                    assert [line for line in chunks if line][-1] == "data: [DONE]"
            except Exception as exc:
                errors.append(f"{name}: {exc!r}")

        def wait_for_live(n: int) -> None:
            deadline = time.monotonic() + 30
            while live.num_live_requests != n:
                assert time.monotonic() < deadline, f"never {n} live request(s); {errors}"
                time.sleep(0.01)

        gate.touch()
        threads = []
        for n, args in enumerate([("blocker", 0, 1), ("low", 5, 8), ("high", 0, 32)], start=1):
            threads.append(threading.Thread(target=send, args=args))
            threads[-1].start()
            wait_for_live(n)  # sent to the engine core, in this order
        time.sleep(0.2)  # delivered to the core while its step waits
        gate.unlink()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert firsts == ["high", "low"]
