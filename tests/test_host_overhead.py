"""The host-work cuts keep what callers see: outputs are snapshots of their step,
whenever they are read, and the step's bookkeeping is unchanged."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferd.engine.config import EngineConfig
from inferd.engine.llm_engine import LLMEngine
from inferd.engine.request.outputs import CompletionOutput
from inferd.engine.request.sampling_params import SamplingParams


@pytest.fixture()
def engine(tiny_model) -> LLMEngine:
    return LLMEngine(EngineConfig(model=tiny_model, device="cpu", block_size=8, seed=1))


def run(engine: LLMEngine) -> list:
    steps = []
    while engine.has_unfinished():
        steps.append(engine.step())
    return steps


@pytest.mark.parametrize("read_late", [False, True])
def test_outputs_are_snapshots_of_their_step(engine, read_late):
    params = SamplingParams(n=2, max_tokens=12, temperature=1.0, seed=5, logprobs=2, ignore_eos=True)
    engine.add_request("a", [5, 6, 7], params)
    engine.add_request("b", [9, 10], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    seen = []  # (step number, output, what it said when the step returned)
    for number, outputs in enumerate(iter(lambda: engine.step() if engine.has_unfinished() else None, None)):
        for out in outputs:
            now = None if read_late else [(list(o.token_ids), list(o.logprobs or []), o.text) for o in out.outputs]
            seen.append((number, out, now))
    finals = {out.request_id: out for _, out, _ in seen if out.finished}
    lengths: dict[tuple, list[int]] = {}
    for number, out, now in seen:
        final = finals[out.request_id]
        for i, o in enumerate(out.outputs):
            ids, logprobs = o.token_ids, o.logprobs
            if now is not None:
                assert (ids, logprobs or [], o.text) == now[i]
            assert len(ids) <= number + 1
            assert ids == final.outputs[i].token_ids[: len(ids)]
            assert o.text == engine.tokenizer.decode(ids)
            if out.request_id == "a":
                assert len(logprobs) == len(ids) and all(t in lp for t, lp in zip(ids, logprobs))
            lengths.setdefault((out.request_id, i), []).append(len(ids))
    # One more token per output until the completion is done (a sibling may go on):
    # a live list read late would show its final length throughout.
    for (rid, i), seq_lengths in lengths.items():
        total = len(finals[rid].outputs[i].token_ids)
        assert seq_lengths[0] <= 1 and seq_lengths[-1] == total
        assert all(b - a == (1 if a < total else 0) for a, b in zip(seq_lengths, seq_lengths[1:])), (
            rid,
            i,
            seq_lengths,
        )


def test_finished_outputs_hand_over_the_whole_lists(engine):
    engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    final = [out for outputs in run(engine) for out in outputs if out.finished][0]
    o = final.outputs[0]
    assert len(o.token_ids) == 5 and o.finish_reason == "length" and o.finished


def test_completion_output_compares_and_prints_like_the_dataclass():
    live = [1, 2, 3]
    a = CompletionOutput(0, "x", live, None, None, None, num_tokens=2)
    live.append(4)
    b = CompletionOutput(0, "x", [1, 2])
    assert a == b and a.token_ids == [1, 2]
    assert repr(a) == (
        "CompletionOutput(index=0, text='x', token_ids=[1, 2], logprobs=None, finish_reason=None, stop_reason=None)"
    )
    b.token_ids = [1]
    assert a != b and not a.finished
    assert CompletionOutput(1, "", [], finish_reason="stop").finished


def test_step_statistics_count_each_token_once(engine):
    engine.add_request("a", [5, 6, 7], SamplingParams(n=3, max_tokens=4, temperature=1.0, ignore_eos=True))
    engine.add_request("b", list(range(10, 30)), SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    generated = prompt = 0
    while engine.has_unfinished():
        engine.step()
        generated += engine.last_step.num_generation_tokens
        prompt += engine.last_step.num_prompt_tokens
    assert generated == engine.counters.generation_tokens == 3 * 4 + 6
    assert prompt == engine.counters.prompt_tokens == 3 + 20
    assert engine.counters.requests_finished["length"] == 2


@given(
    block_size=st.sampled_from([1, 4, 16]),
    start=st.integers(0, 80),
    length=st.integers(0, 80),
    seed=st.integers(0, 1000),
)
def test_token_slots_are_each_positions_block_slot(block_size, start, length, seed):
    """The per-block ranges of token_slots are the per-token formula, across block edges."""
    from inferd.engine.kv.block_manager import token_slots

    end = start + length
    table = random.Random(seed).sample(range(1000), -(-end // block_size) or 1)
    expected = [table[pos // block_size] * block_size + pos % block_size for pos in range(start, end)]
    assert token_slots(table, block_size, start, end) == expected


def _eager_host_bench():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_eager_host.py"
    spec = importlib.util.spec_from_file_location("bench_eager_host", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_eager_host_bench_counts_every_fused_launch_and_restores_the_kernels(tmp_path, capsys):
    """scripts/bench_eager_host.py: each layer's four fused-op launches (two add-RMSNorms,
    RoPE with the K/V write, SiLU-and-multiply) plus the final norm are counted, not run;
    the kernels are back afterwards; an unknown case is refused by name."""
    import json

    import torch

    from inferd.engine.fast_path import fused_ops

    bench = _eager_host_bench()
    before = {name: getattr(fused_ops, name, None) for name in bench.STUBBED_KERNELS}
    threads = torch.get_num_threads()
    out = tmp_path / "eager.json"
    assert bench.main(["--cases", "fresh16,two_groups", "--repeats", "2", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"fresh16", "two_groups"}
    for r in results.values():
        assert r["stubbed_launches_per_layer"] == (4 * bench.LAYERS + 1) / bench.LAYERS
        assert 0 < r["ms_per_step_min"] <= r["ms_per_step_median"]
    assert {name: getattr(fused_ops, name, None) for name in bench.STUBBED_KERNELS} == before
    assert torch.get_num_threads() == threads
    with pytest.raises(SystemExit):
        bench.main(["--cases", "fresh16,nope"])
    assert "unknown case 'nope'" in capsys.readouterr().err
