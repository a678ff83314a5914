"""What a client built for vLLM meets: unknown fields ignored (and logged once) except the
ones that would change the answer, /tokenize and /detokenize against transformers and
against what the generation routes count, /version, GET /v1/models/{id}, prefix-cache
hits in usage and in vllm:request_prefill_kv_computed_tokens, the process collectors."""

from __future__ import annotations

import importlib.metadata
import logging

import httpx
import openai
import pytest

from inferd.engine.server.api_models import ChatCompletionRequest, CompletionRequest
from inferd.engine.server.unknown_fields import REFUSED

from server_fixtures import MODEL_NAME, assert_error, metric_value, running_server, scrape

BLOCK_SIZE = 16
# Fields newer OpenAI clients and gateways send that change nothing here.
NEWER_FIELDS = {
    "reasoning_effort": "low",
    "prompt_cache_key": "tenant-7",
    "safety_identifier": "user-1234",
    "verbosity": "low",
    "use_beam_search": False,  # refused only when it asks for beam search
}


@pytest.fixture(scope="module")
def server(tiny_model):
    with running_server(tiny_model, max_model_len=512, block_size=BLOCK_SIZE) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(tiny_model)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def completion(**fields) -> dict:
    return {"model": MODEL_NAME, "prompt": "Hello there", "max_tokens": 2, "temperature": 0, **fields}


def chat(**fields) -> dict:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **fields}


# --- unknown fields -------------------------------------------------------------------------


def test_unknown_fields_are_ignored_and_logged_once_per_name(server, caplog):
    caplog.set_level(logging.WARNING, logger="inferd.engine.server.unknown_fields")
    name = "x_field_only_this_test_sends"
    for _ in range(3):
        r = post(server, "/v1/completions", completion(**NEWER_FIELDS, **{name: {"nested": [1, 2]}}))
        assert r.status_code == 200, r.text
    lines = [rec.getMessage() for rec in caplog.records if name in rec.getMessage()]
    assert len(lines) == 1, lines


def test_unknown_fields_in_messages_and_stream_options_are_ignored_too(server, caplog):
    caplog.set_level(logging.WARNING, logger="inferd.engine.server.unknown_fields")
    messages = [
        {"role": "user", "content": "Hi", "x_msg_field": 1},
        {"role": "assistant", "content": "Hello", "x_msg_field": 2, "reasoning_content": "thinking"},
        {"role": "user", "content": "And?"},
    ]
    body = chat(messages=messages, stream=True, stream_options={"include_usage": True, "x_opt_field": True})
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert [line for line in r.iter_lines() if line][-1] == "data: [DONE]"
    text = "\n".join(rec.getMessage() for rec in caplog.records)
    assert text.count("messages[].x_msg_field") == 1  # one line for both messages
    assert "stream_options.x_opt_field" in text


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_fields_that_would_change_the_answer_are_refused(server, name):
    """Each refused field, where this server does not declare it, is a 400 naming it when it
    carries a value, and ignored when it carries none."""
    for path, body, model in (
        ("/v1/completions", completion, CompletionRequest),
        ("/v1/chat/completions", chat, ChatCompletionRequest),
    ):
        if name in model.model_fields:
            continue  # a declared field: its own checks apply
        assert_error(post(server, path, body(**{name: True})), 400, f"{name} is not supported", param=name)
        r = post(server, path, body(**{name: None}))
        assert r.status_code == 200, (path, name, r.text)


def test_beam_search_is_refused_through_the_official_client(client):
    with pytest.raises(openai.BadRequestError, match="use_beam_search"):
        client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2, extra_body={"use_beam_search": True})


def test_suffix_and_best_of_stay_refused(server):
    assert_error(post(server, "/v1/completions", completion(suffix="tail")), 400, "suffix", param="suffix")
    assert_error(post(server, "/v1/completions", completion(best_of=3)), 400, "best_of", param="best_of")


# --- /tokenize and /detokenize --------------------------------------------------------------


def test_tokenize_a_prompt_as_the_completions_route_counts_it(server, client, hf_tokenizer):
    prompt = "The quick brown fox jumps over the lazy dog"
    r = post(server, "/tokenize", {"model": MODEL_NAME, "prompt": prompt})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 512 and body["token_strs"] is None
    used = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1).usage.prompt_tokens
    assert body["count"] == used
    plain = post(server, "/tokenize", {"prompt": prompt, "add_special_tokens": False}).json()
    assert plain["tokens"] == hf_tokenizer(prompt, add_special_tokens=False).input_ids
    # The special tokens, when added, come first, then the same content tokens.
    assert body["tokens"][-len(plain["tokens"]) :] == plain["tokens"]
    strs = post(server, "/tokenize", {"prompt": prompt, "return_token_strs": True}).json()["token_strs"]
    assert strs == [hf_tokenizer.convert_ids_to_tokens(i) for i in body["tokens"]]


def test_tokenize_messages_as_the_chat_route_counts_them(server, client, hf_tokenizer):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
    ]
    body = post(server, "/tokenize", {"model": MODEL_NAME, "messages": messages}).json()
    expected = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(expected, list):  # newer transformers return a BatchEncoding
        expected = expected["input_ids"]
    assert body["tokens"] == list(expected)
    used = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=1).usage.prompt_tokens
    assert body["count"] == used
    without = post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False}).json()
    assert without["count"] < body["count"] and body["tokens"][: without["count"]] == without["tokens"]


def test_detokenize_round_trips_and_names_unknown_ids(server):
    text = "Paged attention keeps the cache in blocks."
    ids = post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]
    r = post(server, "/detokenize", {"model": MODEL_NAME, "tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": text}
    assert_error(post(server, "/detokenize", {"tokens": [1, 99999]}), 400, "99999", param="tokens")
    assert_error(post(server, "/detokenize", {"tokens": [-1]}), 400, "-1", param="tokens")


@pytest.mark.parametrize(
    "body, fragment, param",
    [
        ({}, "exactly one of prompt and messages", "messages"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "exactly one", "prompt"),
        ({"messages": []}, "at least one message", "messages"),
        ({"messages": [{"role": "robot", "content": "b"}]}, "role must be one of", "messages[0].role"),
        ({"prompt": "a", "chat_template": "{{ x }}"}, "chat_template is not supported", "chat_template"),
        ({"prompt": "a", "tools": [{"type": "function", "function": {"name": "f"}}]}, "only allowed with", "tools"),
    ],
)
def test_tokenize_400s_name_the_field(server, body, fragment, param):
    assert_error(post(server, "/tokenize", body), 400, fragment, param=param)


def test_tokenize_for_another_model_is_404(server):
    assert_error(post(server, "/tokenize", {"model": "other", "prompt": "a"}), 404, "does not exist", param="model")


# --- /version and GET /v1/models/{id} -------------------------------------------------------


def test_version(server):
    r = httpx.get(f"{server.url}/version", timeout=10)
    assert r.status_code == 200 and r.json() == {"version": importlib.metadata.version("inferd")}


def test_retrieve_model_through_the_official_client(client):
    card = client.models.retrieve(MODEL_NAME)
    assert card.id == MODEL_NAME and card.object == "model"
    assert card == client.models.list().data[0]
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("org/no-such-model")
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"


# --- prefix-cache hits in usage and metrics -------------------------------------------------


def test_cached_tokens_in_usage_and_prefill_kv_computed(server, client):
    prompt = "A shared system prompt that many requests begin with, long enough to fill blocks. " * 3
    first = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    before = scrape(server.url)
    second = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1)
    n = second.usage.prompt_tokens
    cached = second.usage.prompt_tokens_details.cached_tokens
    # Every full block but the one holding the last token (always computed) is a hit.
    assert cached == (n - 1) // BLOCK_SIZE * BLOCK_SIZE and 0 < cached < n
    after = scrape(server.url)
    name = "vllm:request_prefill_kv_computed_tokens"
    assert metric_value(after, f"{name}_count") == metric_value(before, f"{name}_count") + 1
    assert metric_value(after, f"{name}_sum") == metric_value(before, f"{name}_sum") + (n - cached)
    assert (
        metric_value(after, "vllm:request_prompt_tokens_sum")
        == metric_value(before, "vllm:request_prompt_tokens_sum") + n
    )

    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=1,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    again = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=1,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 0
    usage = again[-1].usage
    assert usage.prompt_tokens_details.cached_tokens == (usage.prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE


# --- /metrics --------------------------------------------------------------------------------


def test_process_collectors_and_sleep_state(server):
    text = scrape(server.url)
    assert metric_value(text, "process_resident_memory_bytes") > 0
    assert metric_value(text, "process_cpu_seconds_total") > 0
    assert metric_value(text, "process_open_fds") > 0
    assert "python_info{" in text and "python_gc_objects_collected_total{" in text
    assert metric_value(text, "vllm:engine_sleep_state", {"sleep_state": "awake"}) == 1
    assert metric_value(text, "vllm:engine_sleep_state", {"sleep_state": "discard_all"}) == 0
