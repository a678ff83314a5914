"""Server pieces without a server: stream text hold-back, chat templates, settings,
CLI options, the default model location, bucket layout, and the engine thread's
handling of a failing step."""

from __future__ import annotations

import argparse
import math

import pytest

from inferd.engine.config import EngineConfig
from inferd.engine.request.sampling_params import SamplingParams
from inferd.engine.server.app import ServerSettings
from inferd.engine.server.chat import DEFAULT_CHAT_TEMPLATE, ChatTemplateError, render_chat
from inferd.engine.server.cli import add_arguments, default_model_dir, engine_config_from_args, ensure_default_model
from inferd.engine.server.metrics import build_1_2_5_buckets
from inferd.engine.server.stream_chunks import streamable_text


@pytest.mark.parametrize(
    "text, finished, holdback, expected",
    [
        ("hello", False, 0, "hello"),
        ("hello\ufffd", False, 0, "hello"),  # partial UTF-8 waits for its next byte
        ("hello\ufffd\ufffd", False, 0, "hello"),
        ("hello\ufffd", True, 0, "hello\ufffd"),  # at the end it is what it is
        ("hello wor", False, 3, "hello "),  # a stop string of 4 chars may still start in "wor"
        ("hi", False, 5, ""),
        ("hello wor", True, 3, "hello wor"),
        ("a\ufffdb", False, 0, "a\ufffdb"),  # only a trailing one is held
    ],
)
def test_streamable_text(text, finished, holdback, expected):
    assert streamable_text(text, finished, holdback) == expected


def test_chat_template_from_checkpoint(tiny_model):
    from inferd.engine.text.tokenizer import Tokenizer

    tok = Tokenizer(tiny_model)
    assert tok.chat_template
    text = render_chat([{"role": "user", "content": "Hi"}], tok.chat_template, tok.bos_token, tok.eos_token)
    assert text.startswith(tok.bos_token)
    assert "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    no_prompt = render_chat(
        [{"role": "user", "content": "Hi"}],
        tok.chat_template,
        tok.bos_token,
        tok.eos_token,
        add_generation_prompt=False,
    )
    assert no_prompt.endswith("<|eot_id|>")


def test_default_chat_template():
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    assert render_chat(messages, None) == "system: You are terse.\nuser: Hi\nassistant:"
    assert (
        render_chat(messages, DEFAULT_CHAT_TEMPLATE, add_generation_prompt=False)
        == "system: You are terse.\nuser: Hi\n"
    )


def test_chat_template_errors_are_client_errors():
    template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="first message must be from the user"):
        render_chat([{"role": "assistant", "content": "x"}], template)
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        render_chat([{"role": "user", "content": "x"}], "{{ 1 / 0 }}")
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        render_chat([{"role": "user", "content": "x"}], "{{ messages.__class__.__subclasses__() }}")


def test_server_settings_validation():
    ServerSettings(served_model_name="m")
    with pytest.raises(ValueError, match="served_model_name"):
        ServerSettings(served_model_name="")
    with pytest.raises(ValueError, match="max_body_bytes"):
        ServerSettings(served_model_name="m", max_body_bytes=10)
    with pytest.raises(ValueError, match="admin_token"):
        ServerSettings(served_model_name="m", admin_token="   ")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-level", default="INFO")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_options_cover_every_engine_field():
    args = parse(
        "--model",
        "/m",
        "--max-num-seqs",
        "8",
        "--no-enable-prefix-caching",
        "--preemption-mode",
        "recompute",
        "--gpu-memory-utilization",
        "0.5",
        "--kv-cache-bytes",
        "1048576",
    )
    config = engine_config_from_args(args, "/m")
    assert config == EngineConfig(
        model="/m",
        max_num_seqs=8,
        enable_prefix_caching=False,
        preemption_mode="recompute",
        gpu_memory_utilization=0.5,
        kv_cache_bytes=1 << 20,
    )
    defaults = parse()
    assert (defaults.host, defaults.port) == ("127.0.0.1", 8000)
    assert engine_config_from_args(defaults, "/m") == EngineConfig(model="/m")
    with pytest.raises(ValueError, match="max_num_seqs must be in"):
        engine_config_from_args(parse("--max-num-seqs", "0"), "/m")


def test_default_model_dir(tmp_path, monkeypatch):
    assert default_model_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "inferd" / "models" / "tiny"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_model_dir({}) == tmp_path / "home" / ".cache" / "inferd" / "models" / "tiny"


def test_default_model_is_created_once(tmp_path):
    target = tmp_path / "inferd" / "models" / "tiny"
    assert ensure_default_model(target) == target
    assert (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file()
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    ensure_default_model(target)
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in target.parent.iterdir()] == ["tiny"]  # no temporary leftovers


def test_token_buckets_like_vllm():
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert build_1_2_5_buckets(2048)[-1] == 2000


def flaky_engine(config):
    """An engine whose first step raises (built in the engine core process)."""
    from inferd.engine.llm_engine import LLMEngine

    engine = LLMEngine(config)
    real_step = engine.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real_step()

    engine.step = flaky_step
    return engine


def test_failing_step_fails_its_requests_and_the_engine_keeps_serving(tiny_model):
    import httpx

    from server_fixtures import metric_value, running_server, scrape

    with running_server(tiny_model, engine_factory=flaky_engine, kv_cache_bytes=4 << 20) as s:
        body = {"prompt": "hello", "max_tokens": 4, "temperature": 0}
        first = httpx.post(f"{s.url}/v1/completions", json=body, timeout=30)
        assert first.status_code == 500
        assert first.json()["error"]["code"] == "engine_error" and "boom" in first.json()["error"]["message"]
        second = httpx.post(f"{s.url}/v1/completions", json=body, timeout=30)
        assert second.status_code == 200 and second.json()["usage"]["completion_tokens"] == 4
        text = scrape(s.url)
        assert metric_value(text, "inferd_kv_blocks", {"state": "used"}) == 0
        assert metric_value(text, "vllm:num_requests_running") == 0
        assert metric_value(text, "vllm:request_success_total", {"finished_reason": "abort"}) == 1
        assert httpx.get(f"{s.url}/ready", timeout=10).status_code == 200


def test_percentile_and_knee():
    from inferd.engine.bench.serve import BenchConfig, find_knee, percentile

    assert percentile([3, 1, 2], 50) == 2
    assert percentile([0, 10], 99) == pytest.approx(9.9)
    assert math.isnan(percentile([], 50))
    # Throughput grows linearly to 8 req/s, then flattens: the knee is at 8.
    loads = [1, 2, 4, 8, 16, 32]
    assert find_knee(loads, [10, 20, 40, 80, 84, 85]) == 3
    assert find_knee(loads, [10, 20, 40, 80, 160, 320]) is None  # never bends
    assert find_knee([1, 2], [1, 2]) is None
    with pytest.raises(ValueError, match="loads"):
        find_knee([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="rise"):
        BenchConfig(rates=[4, 2])
    with pytest.raises(ValueError, match="max_tokens"):
        BenchConfig(rates=[1], max_tokens=1)


def test_request_fields_map_onto_sampling_params():
    from inferd.engine.server.api_models import ChatCompletionRequest, CompletionRequest

    body = CompletionRequest(
        prompt="x",
        n=2,
        seed=5,
        stop="END",
        logprobs=3,
        max_tokens=9,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        repetition_penalty=1.1,
        min_tokens=2,
        ignore_eos=True,
        stop_token_ids=[7],
        skip_special_tokens=False,
        priority=3,
    )
    body.check()
    params = body.sampling_params(body.max_tokens, body.logprobs)
    assert params == SamplingParams(
        n=2,
        seed=5,
        stop=["END"],
        logprobs=3,
        max_tokens=9,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        repetition_penalty=1.1,
        min_tokens=2,
        ignore_eos=True,
        stop_token_ids=[7],
        skip_special_tokens=False,
    )
    assert body.priority == 3
    chat = ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=7,
        max_tokens=99,
        logprobs=True,
        top_logprobs=4,
    )
    chat.check()
    assert chat.requested_max_tokens == 7  # the newer name wins
    assert chat.num_logprobs == 4
    assert ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}]).num_logprobs is None
    defaults = CompletionRequest(prompt="x").sampling_params(16, None)
    assert (defaults.temperature, defaults.top_p, defaults.n) == (1.0, 1.0, 1)  # OpenAI's defaults


def test_default_model_is_served_as_its_preset_name(tmp_path, monkeypatch):
    from inferd.engine.server.cli import default_model_dir, served_name

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert served_name(None) == "tiny"
    assert served_name(str(default_model_dir())) == "tiny"  # the stack passes the path explicitly
    assert served_name(str(tmp_path / "other")) == str(tmp_path / "other")


def test_long_text_prompts_are_tokenized_off_the_event_loop():
    """A prompt of TOKENIZE_IN_THREAD_CHARS or more is validated (tokenized) in a worker
    thread; a short one inline, where a thread hop would cost more than it saves."""
    import asyncio
    import threading

    from inferd.engine.server.prompt_encoding import TOKENIZE_IN_THREAD_CHARS
    from inferd.engine.server.serving import OpenAIServing

    threads = {}

    class RecordingEngine:
        tokenizer = None

        def validate_request(self, prompt, params):
            threads[len(prompt)] = threading.current_thread()
            return [1, 2, 3]

    serving = OpenAIServing(RecordingEngine(), "m")
    params = SamplingParams(max_tokens=4)

    async def main():
        short = await serving._validate_prompt("x" * 10, params, "prompt")
        long = await serving._validate_prompt("x" * TOKENIZE_IN_THREAD_CHARS, params, "prompt")
        return short, long, threading.current_thread()

    short, long, loop_thread = asyncio.run(main())
    assert short == long == [1, 2, 3]
    assert threads[10] is loop_thread and threads[TOKENIZE_IN_THREAD_CHARS] is not loop_thread


def test_a_small_temperature_reaches_the_engine_unclamped():
    """One greedy threshold (1e-5, SamplingParams.is_greedy): the API no longer raises
    temperatures below 0.01 to 0.01, so 0.005 samples at 0.005 and 5e-6 is greedy."""
    from inferd.engine.server.api_models import CompletionRequest

    small = CompletionRequest(prompt="x", temperature=0.005).sampling_params(16, None)
    tiny = CompletionRequest(prompt="x", temperature=5e-6).sampling_params(16, None)
    assert small.temperature == 0.005 and not small.is_greedy
    assert tiny.is_greedy
