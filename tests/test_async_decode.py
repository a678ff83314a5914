"""Async scheduling (engine/runner/async_decode.py): decode steps launched before the host has
read the previous step's tokens give exactly the tokens of synchronous steps, through
stops mid-batch, length limits, arrivals, aborts, cold KV and a non-finite step.

The fast decode step runs eagerly on CPU (Triton's interpreter, float32), the same
code the CUDA graphs capture; the synchronous reference is the same engine with
`async_scheduling=False`."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest

from inferd.engine import LLM, SamplingParams
from inferd.engine.fast_path import has_triton

pytestmark = [
    pytest.mark.skipif(
        not has_triton() or os.environ.get("TRITON_INTERPRET") != "1",
        reason="needs triton (pip) with TRITON_INTERPRET=1 for its CPU interpreter",
    ),
    pytest.mark.slow,
]

PROMPTS = [list(range(3, 3 + n)) for n in (21, 5, 13)]


def fast_llm(model: str, **config) -> tuple[LLM, list]:
    """An LLM whose runner has the fused decode step (eager, no graphs) attached, and a
    list that records, per decode launch, whether its input ids came from the device."""
    from inferd.engine.fast_path.attention import triton_paged_attention
    from inferd.engine.fast_path.cuda_graphs import DecodeGraphs
    from inferd.engine.fast_path.fast_decoder import FastDecoder

    llm = LLM(model, block_size=8, **config)
    runner = llm.engine.runner
    graphs = DecodeGraphs(
        FastDecoder(runner.model, runner.kv_layers), 8, 256, runner.device, pages=runner.pages, use_graphs=False
    )
    fed = []
    execute = graphs.execute

    def recording(batch, fed_ids=None):
        fed.append(fed_ids is not None)
        return execute(batch, fed_ids=fed_ids)

    graphs.execute = recording
    runner.fast_decode, runner.fast_attention = graphs, triton_paged_attention
    return llm, fed


def tokens_of(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_async_steps_equal_synchronous_steps_with_stops_and_length_limits(tiny_model):
    """Different max_tokens (rows leave the continuation by length) and a stop token
    that ends one sequence mid-batch (its extra row is dropped): same tokens, same
    finish reasons; most decode steps were fed from the device; every block is freed."""
    sync, _ = fast_llm(tiny_model, async_scheduling=False)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (9, 4, 12)]
    free_run = tokens_of(sync.generate(PROMPTS, params))
    stop = free_run[2][5]  # sequence 2 stops at its 6th token; the others' own tokens decide theirs
    params[2] = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop])
    want = sync.generate(PROMPTS, params)

    llm, fed = fast_llm(tiny_model)
    got = llm.generate(PROMPTS, params)
    assert tokens_of(got) == tokens_of(want)
    assert [o.outputs[0].finish_reason for o in got] == [o.outputs[0].finish_reason for o in want]
    assert got[2].outputs[0].finish_reason == "stop" and len(got[2].outputs[0].token_ids) <= 6
    assert sum(fed) >= len(fed) // 2 and llm.engine.runner.mode == "fast"
    assert llm.engine.counters.decode_steps_launched_ahead == sum(fed)  # served as a Prometheus counter
    assert llm.engine.kv_snapshot().num_used == 0


def test_arrivals_and_aborts_between_async_steps(tiny_model):
    """A request added while a step is in flight is scheduled after it; one aborted while
    in flight is dropped; the rest equal a synchronous engine driven the same way."""

    def drive(llm) -> dict[str, list[int]]:
        engine, done = llm.engine, {}
        params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
        engine.add_request("a", PROMPTS[0], params)
        engine.add_request("b", PROMPTS[1], params)
        for step in range(40):
            if step == 4:
                engine.add_request("c", PROMPTS[2], params)
            if step == 7:
                assert engine.abort("b")
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out.outputs[0].token_ids
            if not engine.has_unfinished():
                break
        return done

    want = drive(fast_llm(tiny_model, async_scheduling=False)[0])
    llm, fed = fast_llm(tiny_model)
    got = drive(llm)
    assert got == want and set(got) == {"a", "c"} and any(fed)
    assert llm.engine.kv_snapshot().num_used == 0


def test_async_steps_across_cold_kv_cooling(tiny_model):
    """Blocks are quantized (int8) while steps are in flight: the continuation's tables
    point at the cold copies; tokens equal the synchronous engine's."""
    config = dict(kv_cold_dtype="int8", kv_hot_window=16)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want = tokens_of(fast_llm(tiny_model, async_scheduling=False, **config)[0].generate(PROMPTS, params))
    llm, fed = fast_llm(tiny_model, **config)
    assert tokens_of(llm.generate(PROMPTS, params)) == want
    assert llm.engine.counters.quantized_blocks["int8"] > 0 and any(fed)


@pytest.mark.parametrize("failure, reason", [("nan", "non_finite_logits"), ("raise", "RuntimeError")])
def test_failing_step_in_flight_reruns_on_the_fallback_path(tiny_model, failure, reason):
    """A continuation whose logits turn non-finite (found when its tokens are read: the
    step launched from them is dropped and this one computed again) or whose launch
    raises: the engine switches to the fallback path and the tokens equal an engine
    that never failed."""
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    want = tokens_of(fast_llm(tiny_model, async_scheduling=False)[0].generate(PROMPTS, params))
    llm, fed = fast_llm(tiny_model)
    graphs = llm.engine.runner.fast_decode
    execute, forward, calls = graphs.execute, graphs.decoder.forward, []

    def failing(batch, fed_ids=None):
        calls.append(fed_ids is not None)
        if len(calls) == 3 and failure == "raise":
            raise RuntimeError("kernel launch failed")
        return execute(batch, fed_ids=fed_ids)

    def nan_on_third_step(*args, **kwargs):  # inside the step: its greedy head must see it
        logits = forward(*args, **kwargs)
        if len(calls) == 3:
            logits[0, 0] = float("nan")
        return logits

    graphs.execute, graphs.decoder.forward = failing, nan_on_third_step
    assert tokens_of(llm.generate(PROMPTS, params)) == want
    # A continuation failed; the fallback is sticky. A non-finite step is found only when its
    # tokens are read, after the step fed by them was launched (and then dropped).
    assert llm.engine.runner.mode == "fallback" and calls[2] and len(calls) == (4 if failure == "nan" else 3)
    assert llm.engine.counters.fastpath_failures[reason] == 1
    assert llm.engine.kv_snapshot().num_used == 0


def test_sampled_requests_launch_ahead_and_draw_what_the_synchronous_engine_draws(tiny_model):
    """Seeded sampled rows (temperature, top-k, top-p, min-p) beside a greedy row launch
    ahead like greedy ones: their tokens are drawn on the device from (seed, output
    position), so they equal the synchronous engine's token for token."""
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=8, seed=3, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=1.2, top_k=20, min_p=0.02, max_tokens=8, seed=4, ignore_eos=True),
    ]
    want = tokens_of(fast_llm(tiny_model, async_scheduling=False)[0].generate(PROMPTS, params))
    llm, fed = fast_llm(tiny_model)
    assert tokens_of(llm.generate(PROMPTS, params)) == want
    assert sum(fed) >= len(fed) // 2 and llm.engine.runner.mode == "fast"
    assert len({t for row in want[::2] for t in row}) > 4  # they do sample


def test_logprob_rows_launch_ahead_and_read_back_the_synchronous_logprobs(tiny_model):
    """Rows asking for logprobs (greedy, sampled, seeded; N = 0 up to 20) beside rows
    asking none launch ahead: their tokens and logprobs are computed on the device after
    the step and come back in its copy, equal to the synchronous engine's. Rows leave by
    length on different steps, so the logprob rows move within the batch."""
    prompts = [list(range(3, 3 + n)) for n in (21, 5, 13, 9, 17)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=9, logprobs=3, ignore_eos=True),
        SamplingParams(temperature=0.9, top_k=20, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=11, seed=5, logprobs=0, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True),
        SamplingParams(temperature=1.1, min_p=0.05, max_tokens=10, logprobs=20, ignore_eos=True),
    ]
    sync = fast_llm(tiny_model, async_scheduling=False)[0]
    want = sync.generate(prompts, params)
    assert sync.engine.counters.decode_steps_launched_ahead == 0
    llm, fed = fast_llm(tiny_model)
    got = llm.generate(prompts, params)
    assert tokens_of(got) == tokens_of(want)
    assert [o.outputs[0].logprobs for o in got] == [o.outputs[0].logprobs for o in want]
    assert [len(o.outputs[0].logprobs or []) for o in got] == [9, 0, 11, 0, 10]
    assert all(len(d) in (20, 21) for d in got[4].outputs[0].logprobs)
    assert llm.engine.counters.decode_steps_launched_ahead > 0 and sum(fed) >= len(fed) // 2
    assert llm.engine.runner.mode == "fast" and llm.engine.kv_snapshot().num_used == 0


def test_penalty_bias_and_min_tokens_rows_launch_ahead_and_draw_what_the_synchronous_engine_draws(tiny_model):
    """Penalties (their counts take each drawn token on the device), a logit bias and a
    min_tokens ban are applied after a step launched ahead as in the synchronous sampler:
    the same tokens and logprobs, most steps fed from the device."""
    stop = 9
    params = [
        SamplingParams(temperature=0.8, max_tokens=10, seed=3, logprobs=1, frequency_penalty=2.0, ignore_eos=True),
        # token 7 leads by its bias until its count's penalty pulls it back: a count missed changes the tokens
        SamplingParams(temperature=0.0, max_tokens=12, logit_bias={7: 20.0}, frequency_penalty=2.0, ignore_eos=True),
        SamplingParams(temperature=0.9, max_tokens=8, logit_bias={7: 3.0, 11: -50.0}, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=9, min_tokens=6, stop_token_ids=[stop]),
    ]
    prompts = PROMPTS + [[3, 4, 5]]
    sync = fast_llm(tiny_model, async_scheduling=False)[0]
    want = sync.generate(prompts, params)
    llm, fed = fast_llm(tiny_model)
    got = llm.generate(prompts, params)
    assert tokens_of(got) == tokens_of(want)
    assert [o.outputs[0].logprobs for o in got] == [o.outputs[0].logprobs for o in want]
    assert llm.engine.counters.decode_steps_launched_ahead > 0 and sum(fed) >= len(fed) // 2
    assert 3 <= tokens_of(got)[1].count(7) <= 8  # chosen, held back by its count, chosen again
    assert stop not in tokens_of(got)[3][:6]


def test_grammar_rows_keep_the_synchronous_path(tiny_model):
    """A structured-outputs row's allowed tokens follow the host's matcher: no step is
    launched from device tokens."""
    from inferd.engine.structured_outputs.params import StructuredOutputsParams

    params = SamplingParams(temperature=0.0, max_tokens=6, structured_outputs=StructuredOutputsParams(regex="[ab]+"))
    want = tokens_of(fast_llm(tiny_model, async_scheduling=False)[0].generate(PROMPTS, params))
    llm, fed = fast_llm(tiny_model)
    assert tokens_of(llm.generate(PROMPTS, params)) == want and not any(fed)
    assert llm.engine.counters.decode_steps_launched_ahead == 0


def test_async_scheduling_must_be_a_bool():
    from inferd.engine.config import EngineConfig

    with pytest.raises(ValueError, match="async_scheduling must be true or false"):
        EngineConfig(async_scheduling="yes")
