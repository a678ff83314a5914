"""Prompt log-probabilities: the engine's (SamplingParams.prompt_logprobs) against
transformers' in float32 on a random checkpoint, across chunked prefill, the prefix
cache and n > 1; and through the server with the official `openai` client: completions
`echo` (with max_tokens 0 and above, streamed and not) in OpenAI's shape, vLLM's
`prompt_logprobs` field on completions and chat, and the 400s naming the field."""

from __future__ import annotations

import math

import openai
import pytest
import torch

from inferd.engine import LLM, SamplingParams

from hf_reference import hf_logits, load_hf
from server_fixtures import MODEL_NAME, running_server

PROMPT = [7 + (i * 37) % 400 for i in range(41)]  # 41 tokens: several chunks and blocks
TOL = 1e-4


@pytest.fixture(scope="module")
def model_dir(model_factory) -> str:
    return model_factory(preset="tiny", seed=21)


@pytest.fixture(scope="module")
def reference(model_dir) -> torch.Tensor:
    """transformers' log-probabilities [positions, vocab] for PROMPT, float32."""
    return torch.log_softmax(hf_logits(load_hf(model_dir), PROMPT), dim=-1)


def _check_against(reference: torch.Tensor, prompt_logprobs, k: int) -> None:
    assert len(prompt_logprobs) == len(PROMPT)
    assert prompt_logprobs[0] is None
    for i in range(1, len(PROMPT)):
        entry, row = prompt_logprobs[i], reference[i - 1]
        own = entry[PROMPT[i]]
        assert math.isclose(own.logprob, float(row[PROMPT[i]]), abs_tol=TOL), i
        assert own.rank == int((row > row[PROMPT[i]]).sum()) + 1, i
        top = torch.topk(row, k).indices.tolist() if k else []
        assert set(entry) == set(top) | {PROMPT[i]}, i
        for tid, lp in entry.items():
            assert math.isclose(lp.logprob, float(row[tid]), abs_tol=TOL), (i, tid)
            assert lp.decoded_token is not None


@pytest.mark.parametrize("budget", [16, 512], ids=["chunked", "one-chunk"])
def test_engine_prompt_logprobs_match_transformers(model_dir, reference, budget):
    llm = LLM(model_dir, dtype="float32", block_size=8, max_num_batched_tokens=budget)
    out = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=3))[0]
    _check_against(reference, out.prompt_logprobs, 3)
    assert out.outputs[0].logprobs is None  # prompt logprobs do not ask for the completion's


def test_prompt_logprobs_zero_gives_the_prompt_token_only(model_dir, reference):
    llm = LLM(model_dir, dtype="float32")
    out = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0))[0]
    _check_against(reference, out.prompt_logprobs, 0)
    assert all(len(e) == 1 for e in out.prompt_logprobs[1:])


def test_prefix_cached_prompt_is_scored_again(model_dir, reference):
    """A request for prompt logprobs takes no prefix-cache hits: its prompt is computed
    and scored whole, even right after the same prompt filled the cache."""
    llm = LLM(model_dir, dtype="float32", block_size=8, enable_prefix_caching=True)
    llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=1))
    hits_before = llm.engine.block_manager.prefix.hits
    llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=1))
    assert llm.engine.block_manager.prefix.hits > hits_before  # the cache holds the prompt
    hits_before = llm.engine.block_manager.prefix.hits
    out = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1))[0]
    assert llm.engine.block_manager.prefix.hits == hits_before
    assert out.num_cached_tokens == 0
    _check_against(reference, out.prompt_logprobs, 1)


def test_n_siblings_and_plain_requests_in_one_batch(model_dir, reference):
    llm = LLM(model_dir, dtype="float32", max_num_batched_tokens=16)
    outs = llm.generate(
        [PROMPT, PROMPT[:20]],
        [
            SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=3, prompt_logprobs=2),
            SamplingParams(temperature=0.0, max_tokens=3),
        ],
    )
    _check_against(reference, outs[0].prompt_logprobs, 2)
    assert len(outs[0].outputs) == 3
    assert outs[1].prompt_logprobs is None


@pytest.mark.slow
def test_tensor_parallel_prompt_logprobs_match_transformers(model_dir, reference):
    """The scored rows ride with the sampling rows to every rank (no new worker message)."""
    llm = LLM(model_dir, dtype="float32", tensor_parallel_size=2, max_num_batched_tokens=16)
    try:
        out = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=2))[0]
    finally:
        llm.engine.runner.shutdown()
    _check_against(reference, out.prompt_logprobs, 2)


@pytest.mark.parametrize("value", [-1, 21, 1.5, True])
def test_sampling_params_refuse_bad_prompt_logprobs(value):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=value)


# --- through the server ---------------------------------------------------------------


@pytest.fixture(scope="module")
def server(model_dir):
    with running_server(model_dir, dtype="float32", max_num_batched_tokens=16) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def _prompt_text(client) -> str:
    return client.completions.create(model=MODEL_NAME, prompt=[PROMPT], max_tokens=0, echo=True).choices[0].text


def test_echo_logprobs_equal_the_engine_and_transformers(client, reference):
    resp = client.completions.create(
        model=MODEL_NAME, prompt=[PROMPT], max_tokens=1, logprobs=1, echo=True, temperature=0.0
    )
    choice = resp.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(PROMPT) + 1  # the prompt, then the one completion token
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i in range(1, len(PROMPT)):
        assert math.isclose(lp.token_logprobs[i], float(reference[i - 1][PROMPT[i]]), abs_tol=TOL), i
        assert max(lp.top_logprobs[i].values()) == pytest.approx(float(reference[i - 1].max()), abs=TOL)
    # the completion's own token: the greedy choice after the prompt
    assert lp.token_logprobs[-1] == pytest.approx(float(reference[-1].max()), abs=TOL)
    prompt_text = _prompt_text(client)
    assert choice.text.startswith(prompt_text) and len(choice.text) > len(prompt_text)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert "".join(lp.tokens) == choice.text

    # the same numbers as the engine's own prompt logprobs (vLLM's prompt_logprobs field)
    raw = client.completions.create(
        model=MODEL_NAME, prompt=[PROMPT], max_tokens=1, temperature=0.0, extra_body={"prompt_logprobs": 1}
    )
    engine_lps = raw.choices[0].model_extra["prompt_logprobs"]
    assert engine_lps[0] is None
    for i in range(1, len(PROMPT)):
        entry = engine_lps[i][str(PROMPT[i])]
        assert entry["logprob"] == lp.token_logprobs[i]
        assert entry["rank"] >= 1 and isinstance(entry["decoded_token"], str)
        assert len(engine_lps[i]) <= 2


def test_echo_with_max_tokens_zero_returns_the_prompt_alone(client, reference):
    resp = client.completions.create(model=MODEL_NAME, prompt=[PROMPT], max_tokens=0, logprobs=2, echo=True)
    choice = resp.choices[0]
    assert len(choice.logprobs.tokens) == len(PROMPT)
    assert "".join(choice.logprobs.tokens) == choice.text
    assert all(len(top) <= 3 for top in choice.logprobs.top_logprobs[1:])  # top-2 and the prompt's own
    assert resp.usage.completion_tokens == 0 and resp.usage.prompt_tokens == len(PROMPT)
    assert choice.finish_reason == "length"


def test_echo_of_a_text_prompt_without_logprobs(client):
    resp = client.completions.create(model=MODEL_NAME, prompt="hello world", max_tokens=3, echo=True)
    assert resp.choices[0].text.startswith("hello world")
    assert resp.choices[0].logprobs is None


def test_streamed_echo_matches_the_whole_response(client):
    whole = client.completions.create(
        model=MODEL_NAME, prompt=[PROMPT], max_tokens=4, logprobs=1, echo=True, temperature=0.0
    )
    chunks = list(
        client.completions.create(
            model=MODEL_NAME, prompt=[PROMPT], max_tokens=4, logprobs=1, echo=True, temperature=0.0, stream=True
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    streamed = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed == whole.choices[0].logprobs.token_logprobs
    only_prompt = list(
        client.completions.create(model=MODEL_NAME, prompt=[PROMPT], max_tokens=0, echo=True, stream=True)
    )
    assert "".join(c.choices[0].text for c in only_prompt if c.choices) == _prompt_text(client)


def test_chat_prompt_logprobs(client):
    resp = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=2,
        extra_body={"prompt_logprobs": 0},
    )
    lps = resp.model_extra["prompt_logprobs"]
    assert lps[0] is None and len(lps) == resp.usage.prompt_tokens
    assert all(len(e) == 1 and next(iter(e.values()))["logprob"] <= 0 for e in lps[1:])


def test_streamed_prompt_logprobs_come_once_with_the_first_chunk(client):
    kwargs = dict(model=MODEL_NAME, prompt=[PROMPT], max_tokens=3, temperature=0.0, extra_body={"prompt_logprobs": 2})
    whole = client.completions.create(**kwargs).choices[0].model_extra["prompt_logprobs"]
    chunks = [c for c in client.completions.create(stream=True, **kwargs) if c.choices]
    sent = [c.choices[0].model_extra.get("prompt_logprobs") for c in chunks]
    assert sent[0] == whole and all(s is None for s in sent[1:])

    messages = [{"role": "user", "content": "hello there"}]
    chat = dict(model=MODEL_NAME, messages=messages, max_tokens=3, temperature=0.0, extra_body={"prompt_logprobs": 1})
    whole = client.chat.completions.create(**chat).model_extra["prompt_logprobs"]
    streamed = [c.model_extra.get("prompt_logprobs") for c in client.chat.completions.create(stream=True, **chat)]
    assert [s for s in streamed if s is not None] == [whole]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": 1, "prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt": "hi", "max_tokens": 1, "prompt_logprobs": -1}, "prompt_logprobs"),
        ({"prompt": "hi", "max_tokens": 1, "echo": True, "logprobs": 21}, "logprobs"),
    ],
)
def test_bad_values_are_400s_naming_the_field(server, body, field):
    import httpx

    r = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL_NAME, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_chat_refuses_bad_prompt_logprobs(server):
    import httpx

    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 30},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"
