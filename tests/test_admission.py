"""Requests that can never fit the KV pool are refused; max_model_len is bounded by the
pool; a request at the limit completes in both preemption modes; the prefill phase of
the request metrics starts when the sequence is scheduled, not after its step."""

from __future__ import annotations

import logging
import time

import httpx
import pytest

from inferd.engine import EngineConfig, LLMEngine, SamplingParams
from inferd.engine.stats import FinishedRequestStats

from server_fixtures import MODEL_NAME, running_server

SMALL_POOL = 524288  # 64 blocks of 16 tokens for the tiny model: 1,024 tokens, below its max_model_len


def small_engine(tiny_model, **options) -> LLMEngine:
    return LLMEngine(EngineConfig(model=tiny_model, kv_cache_bytes=SMALL_POOL, **options))


def pool_tokens(engine: LLMEngine) -> int:
    lim = engine.request_limits
    return lim.num_usable_blocks * lim.block_size


def run_to_end(engine: LLMEngine, max_steps: int = 5000) -> list:
    finished = []
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return finished
        finished += [o for o in engine.step() if o.finished]
    raise AssertionError(f"{engine.num_unfinished} request(s) unfinished after {max_steps} steps")


def test_request_that_cannot_fit_is_refused(tiny_model):
    engine = small_engine(tiny_model)
    lim = engine.request_limits
    params = SamplingParams(max_tokens=1000, ignore_eos=True, temperature=0.0)
    with pytest.raises(ValueError) as err:
        engine.add_request("big", [5] * 900, params)
    needed = -(-1900 // lim.block_size)
    assert str(err.value) == (
        f"prompt (900 tokens) + max_tokens (1000) needs {needed} KV blocks of {lim.block_size} tokens; "
        f"the KV pool holds {lim.num_usable_blocks} for one sequence ({pool_tokens(engine):,} tokens)"
    )
    assert not engine.has_unfinished()
    with pytest.raises(ValueError, match="each of the n=2 sequences must fit alone"):
        engine.validate_request([5] * 900, SamplingParams(n=2, max_tokens=1000))
    # The same prompt with a max_tokens that fits is accepted.
    engine.validate_request([5] * 900, SamplingParams(max_tokens=pool_tokens(engine) - 900))


def test_max_model_len_is_clamped_to_the_pool(tiny_model, caplog):
    with caplog.at_level(logging.WARNING, logger="inferd.engine.llm_engine"):
        engine = small_engine(tiny_model)
    assert engine.model_config.max_position_embeddings > pool_tokens(engine)
    assert engine.max_model_len == engine.request_limits.max_model_len == pool_tokens(engine)
    assert any(f"clamped to {pool_tokens(engine)}" in r.getMessage() for r in caplog.records)
    # A max_tokens of the whole context (what the server asks when the client gives none) is
    # accepted, and generation stops where the pool ends.
    engine.validate_request([5] * 10, SamplingParams(max_tokens=engine.model_config.max_position_embeddings))


def test_max_model_len_that_fits_is_kept(tiny_model, caplog):
    with caplog.at_level(logging.WARNING, logger="inferd.engine.llm_engine"):
        engine = small_engine(tiny_model, max_model_len=512)
    assert engine.max_model_len == 512
    assert not any("clamped" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_request_at_the_limit_completes(tiny_model, mode):
    # Two requests at the limit cannot both hold their blocks: one preempts the other,
    # or itself, and both still finish.
    engine = small_engine(tiny_model, preemption_mode=mode, swap_space_bytes=SMALL_POOL, max_num_batched_tokens=256)
    limit = pool_tokens(engine)
    params = SamplingParams(max_tokens=limit - 600, ignore_eos=True, temperature=0.0)
    engine.add_request("a", [5] * 600, params)
    engine.add_request("b", [7] * 600, params)
    outs = run_to_end(engine)
    assert sorted(o.request_id for o in outs) == ["a", "b"]
    assert all(len(o.outputs[0].token_ids) == limit - 600 for o in outs)
    faults = engine.counters.swap_in_faults if mode == "swap" else engine.counters.recompute_faults
    assert engine.counters.num_preemptions > 0 and faults > 0
    assert engine.block_manager.num_used_blocks == 0
    assert engine.block_manager.host_pool.num_free_blocks == engine.block_manager.host_pool.num_blocks


def test_server_refuses_what_cannot_fit_and_serves_the_next(tiny_model):
    with running_server(tiny_model, kv_cache_bytes=SMALL_POOL) as s:
        big = httpx.post(
            f"{s.url}/v1/completions",
            timeout=30,
            json={"model": MODEL_NAME, "prompt": [5] * 900, "max_tokens": 1000, "ignore_eos": True, "temperature": 0},
        )
        assert big.status_code == 400, big.text
        assert big.json()["error"]["code"] == "context_length_exceeded"
        assert "KV" in big.json()["error"]["message"]
        small = httpx.post(
            f"{s.url}/v1/completions",
            timeout=30,
            json={"model": MODEL_NAME, "prompt": [5] * 10, "max_tokens": 5, "ignore_eos": True, "temperature": 0},
        )
        assert small.status_code == 200, small.text
        assert small.json()["usage"]["completion_tokens"] == 5
        # Without max_tokens the prompt and the context decide it, and that fits.
        open_ended = httpx.post(
            f"{s.url}/v1/completions", timeout=60, json={"model": MODEL_NAME, "prompt": [5] * 10, "temperature": 0}
        )
        assert open_ended.status_code == 200, open_ended.text
        # The API server takes the engine core's clamped context length.
        assert httpx.get(f"{s.url}/v1/models").json()["data"][0]["max_model_len"] == 1024
        too_long = httpx.post(
            f"{s.url}/v1/completions", timeout=30, json={"model": MODEL_NAME, "prompt": [5] * 10, "max_tokens": 1500}
        )
        assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
        assert "1024" in too_long.json()["error"]["message"]


def test_prefill_time_counts_the_step_not_the_queue(tiny_model, monkeypatch):
    engine = LLMEngine(EngineConfig(model=tiny_model, kv_cache_bytes=SMALL_POOL))
    execute = engine.runner.execute

    def slow_execute(batch):
        time.sleep(0.05)
        return execute(batch)

    monkeypatch.setattr(engine.runner, "execute", slow_execute)
    engine.add_request("r", [5] * 20, SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0))
    finished: list[FinishedRequestStats] = []
    while engine.has_unfinished():
        engine.step()
        finished += engine.last_step.finished
    [stats] = finished
    assert stats.prefill_time >= 0.05
    assert stats.queue_time < 0.05
    assert stats.decode_time >= 2 * 0.05


def _admissions(engine: LLMEngine, max_steps: int = 5000) -> dict[str, int]:
    """request id -> the scheduler step that admitted it, in admission order, for the
    requests not running yet (run to the end)."""
    before = {s.request_id for s in engine.scheduler.running}
    admitted: dict[str, int] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return admitted
        engine.step()
        for s in engine.scheduler.running:
            if s.request_id not in before:
                admitted.setdefault(s.request_id, engine.scheduler.step_count)
    raise AssertionError("requests unfinished")


def test_a_request_waiting_for_room_does_not_block_smaller_ones_behind_it(tiny_model):
    """A big request that fits the pool only once the running one is done waits; small
    requests that arrive after it and fit now go ahead instead of queueing behind it."""
    engine = small_engine(tiny_model, preemption_mode="recompute", watermark=0.0)
    tokens = pool_tokens(engine)
    params = lambda n: SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0)  # noqa: E731
    engine.add_request("running", [5] * (tokens // 2), params(64))
    engine.step()
    engine.add_request("big", [6] * (tokens // 2 + 64), params(16))
    for i in range(3):
        engine.add_request(f"small{i}", [7 + i] * 16, params(4))
    admitted = _admissions(engine)
    # the small ones at once (step 2); big once "running" has left: its prefill took step 1
    # and each of its 63 other tokens one step, so it is gone after step 64
    assert list(admitted) == ["small0", "small1", "small2", "big"]
    assert admitted == {"small0": 2, "small1": 2, "small2": 2, "big": 65}


def test_a_request_blocked_for_the_aging_steps_stops_admission_behind_it(tiny_model):
    """After priority_aging_steps without room, nothing is admitted past it: a stream of
    small requests cannot starve a big one."""
    engine = small_engine(tiny_model, preemption_mode="recompute", watermark=0.0, priority_aging_steps=1)
    tokens = pool_tokens(engine)
    params = lambda n: SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0)  # noqa: E731
    engine.add_request("running", [5] * (tokens // 2), params(64))
    engine.step()
    engine.add_request("big", [6] * (tokens // 2 + 64), params(16))
    engine.step()  # big finds no room: blocked from this step
    engine.step()
    engine.add_request("small", [7] * 16, params(4))
    admitted = _admissions(engine)
    # small fits from step 4 but waits behind big, which gets in when "running" has left
    # after step 64; small follows in the same step
    assert list(admitted) == ["big", "small"]
    assert admitted == {"big": 65, "small": 65}
