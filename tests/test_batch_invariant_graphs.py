"""Deterministic mode's decode graphs (engine/runner/batch_invariant_graphs.py): padded decode
steps, run here eagerly on the CPU (CUDA graphs need a GPU; the GPU run is
scripts/gpu_fastpath_check.py's and the deterministic benchmark's), give every request
bitwise the tokens, logprobs and K/V of the plain deterministic engine."""

from __future__ import annotations

import pytest
import torch

from inferd.engine import LLM, SamplingParams
from inferd.engine.fast_path.cuda_graphs import DecodeInputs
from inferd.engine.runner.batch_invariant_graphs import (
    InvariantDecodeGraphs,
    attach_invariant_decode,
    copies_of_first_row,
)

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
SEEDED = SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=12, ignore_eos=True, logprobs=2)
PROMPTS = [f"request {i} about paged attention " * (1 + i % 3) for i in range(5)]
PARAMS = [GREEDY, SEEDED, GREEDY, SEEDED, GREEDY]


def deterministic_llm(model: str, ladder: tuple[int, ...] | None) -> LLM:
    llm = LLM(model, block_size=8, dtype="bfloat16", deterministic=True)
    runner = llm.engine.runner
    if ladder is not None:
        runner.invariant_decode = InvariantDecodeGraphs(
            runner.model,
            lambda: runner.kv_layers,
            runner.block_size,
            llm.engine.max_model_len,
            runner.kv_cache.num_blocks,
            runner.device,
            ladder=ladder,
            use_graphs=False,
        )
    return llm


def outputs(llm: LLM) -> list[tuple]:
    done = llm.generate(PROMPTS, PARAMS)
    return [(o.outputs[0].token_ids, [sorted(lp.items()) for lp in o.outputs[0].logprobs or []]) for o in done]


def test_padding_copies_the_first_row():
    rows = DecodeInputs([7, 8], [3, 9], [19, 41], [4, 10], [[2], [5, 1]])
    padded = copies_of_first_row(rows, 4)
    assert padded.input_ids == [7, 8, 7, 7] and padded.slots == [19, 41, 19, 19]
    assert padded.positions == [3, 9, 3, 3] and padded.context_lens == [4, 10, 4, 4]
    assert padded.block_tables == [[2], [5, 1], [2], [2]]
    with pytest.raises(ValueError, match="3 rows do not fit a graph of 2"):
        copies_of_first_row(DecodeInputs([1, 2, 3], [0] * 3, [0] * 3, [1] * 3, [[0]] * 3), 2)
    with pytest.raises(ValueError, match="no row to copy"):
        copies_of_first_row(DecodeInputs([], [], [], [], []), 2)


def test_padded_decode_steps_give_the_plain_engines_outputs_and_kv(tiny_model):
    """Five requests decode in steps of 5, then fewer as they finish, padded to 8 (or 4, 2)
    with copies of the first row: tokens, logprobs and the K/V arena are bitwise those
    of the deterministic engine without graphs."""
    plain = deterministic_llm(tiny_model, None)
    padded = deterministic_llm(tiny_model, (2, 4, 8))
    assert outputs(padded) == outputs(plain)
    graphs = padded.engine.runner.invariant_decode
    assert graphs is not None and graphs.num_eager > 0
    assert torch.equal(padded.engine.kv_cache.device_pool.bytes, plain.engine.kv_cache.device_pool.bytes)


def test_each_request_alone_matches_the_padded_batch(tiny_model):
    batch = outputs(deterministic_llm(tiny_model, (8,)))
    alone_llm = deterministic_llm(tiny_model, (8,))
    for prompt, params, expected in zip(PROMPTS, PARAMS, batch):
        (done,) = alone_llm.generate([prompt], [params])
        assert (done.outputs[0].token_ids, [sorted(lp.items()) for lp in done.outputs[0].logprobs]) == expected


def test_steps_the_graphs_do_not_take(tiny_model):
    llm = deterministic_llm(tiny_model, (1, 2))
    engine, graphs = llm.engine, llm.engine.runner.invariant_decode
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"r{i}", f"prompt {i}", params)
    batch = engine.scheduler.schedule().scheduled
    assert not graphs.can_run(batch)  # prefill
    engine.step()
    decode = engine.scheduler.schedule().scheduled
    assert len(decode) == 3 and not graphs.can_run(decode)  # more rows than the ladder's top
    assert graphs.can_run(decode[:2])
    seq = decode[0].seq
    seq.block_table.append(engine.kv_cache.num_blocks)  # a cold page's id
    assert not graphs.can_run(decode[:1])
    seq.block_table.pop()


def test_a_failing_graph_step_is_rerun_eagerly(tiny_model):
    reference = outputs(deterministic_llm(tiny_model, None))
    llm = deterministic_llm(tiny_model, (8,))
    engine = llm.engine
    for i, (prompt, params) in enumerate(zip(PROMPTS, PARAMS)):
        engine.add_request(f"r{i}", prompt, params)
    engine.step()  # prefill
    engine.step()  # the first decode step, on the graphs
    engine.runner.inject_fastpath_failure("test")
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    got = [
        (finished[f"r{i}"].outputs[0].token_ids, [sorted(lp.items()) for lp in finished[f"r{i}"].outputs[0].logprobs])
        for i in range(len(PROMPTS))
    ]
    assert got == reference
    assert engine.config.mode == "fallback" and engine.counters.fastpath_failures["injected"] == 1


def test_no_graphs_off_the_gpu(tiny_model):
    llm = LLM(tiny_model, block_size=8, deterministic=True)
    runner = llm.engine.runner
    assert runner.invariant_decode is None
    assert attach_invariant_decode(runner, llm.engine.max_model_len) == (
        "deterministic mode: the batch-invariant portable steps"
    )
    assert llm.engine.fast_path_unavailable == "deterministic mode: the batch-invariant portable steps"


def test_benchmark_compares_deterministic_mode_with_and_without_graphs():
    from inferd.engine.bench.deterministic import compare_modes

    modes = [
        {"deterministic": False, "decode_graphs": False, "alone_tokens": [[1], [2]]},
        {"deterministic": True, "decode_graphs": True, "alone_tokens": [[1], [3]]},
        {"deterministic": True, "decode_graphs": False, "alone_tokens": [[1], [4]]},
    ]
    assert compare_modes(modes) == {"probes_same_with_and_without_graphs": 1}
    assert all("alone_tokens" not in m for m in modes)
    assert compare_modes([{"deterministic": True, "decode_graphs": False, "alone_tokens": [[1]]}]) == {}
