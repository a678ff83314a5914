"""Deterministic mode (engine/runner/batch_invariant.py): a request's outputs alone and inside a
busy batch, with chunked prefill and prefix-cache hits, are bitwise the same."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from inferd.engine import LLM, EngineConfig, SamplingParams
from inferd.engine.fast_path.availability import has_triton
from inferd.engine.model.attention import AttentionMetadata, paged_attention
from inferd.engine.runner.batch_invariant import ROW_TILE, _token_rows_on_device, invariant_attention, tiled

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2)
SEEDED = SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=24, ignore_eos=True, logprobs=2)
PREFIX = "a shared system prompt that the prefix cache keeps between requests "
PROMPTS = [PREFIX + f"then question number {i} about the paged cache " * (1 + i % 4) for i in range(8)]
PARAMS = [GREEDY] * 4 + [SEEDED] * 4


def outputs(llm: LLM, prompts: list[str], params: list[SamplingParams]) -> list[tuple]:
    """Per request: its tokens and every position's logprobs, exactly as floats."""
    done = llm.generate(prompts, params)
    return [(o.outputs[0].token_ids, [sorted(lp.items()) for lp in o.outputs[0].logprobs or []]) for o in done]


def alone_and_busy(
    model: str, dtype: str, deterministic: bool, step_ops=None, requests: int = len(PROMPTS), noise_count: int = 12
) -> tuple[list, list]:
    """The first `requests` probes alone, then inside a busy batch; `step_ops`: the
    model's forward steps instead of the mode's own."""

    def engine(**kwargs) -> LLM:
        llm = LLM(model, block_size=8, dtype=dtype, deterministic=deterministic, **kwargs)
        if step_ops is not None:
            llm.engine.runner.model.step_ops = step_ops
        return llm

    prompts, params = PROMPTS[:requests], PARAMS[:requests]
    alone_llm = engine(enable_prefix_caching=False)
    alone = [outputs(alone_llm, [p], [sp])[0] for p, sp in zip(prompts, params)]
    # small step budget: prompts are prefilled in chunks beside other sequences' decodes;
    # the first request warms the prefix cache for the shared system prompt
    busy_llm = engine(max_num_batched_tokens=40)
    busy_llm.generate(PREFIX + "warm", SamplingParams(max_tokens=1))
    noise = [f"noise request {i} " * (3 + i) for i in range(noise_count)]
    other = SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)
    busy = outputs(busy_llm, prompts + noise, params + [other] * len(noise))[: len(prompts)]
    assert busy_llm.engine.counters.prefix_hits > 0
    return alone, busy


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_outputs_alone_and_in_a_busy_batch_are_bitwise_equal(tiny_model, dtype):
    alone, busy = alone_and_busy(tiny_model, dtype, deterministic=True)
    assert [tokens for tokens, _ in busy] == [tokens for tokens, _ in alone]
    assert busy == alone  # the logprobs too, to the last bit


def test_the_default_mode_differs_in_the_same_scenario(tiny_model):
    """The scenario above exercises batch-dependent numerics: without deterministic mode
    the logprobs of the same requests are not bitwise equal alone and in the batch."""
    alone, busy = alone_and_busy(tiny_model, "bfloat16", deterministic=False)
    assert busy != alone


@pytest.mark.slow
@pytest.mark.skipif(
    not has_triton() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton (pip) with TRITON_INTERPRET=1 for its CPU interpreter",
)
def test_fused_invariant_steps_alone_and_in_a_busy_batch(tiny_model):
    """The GPU's steps (fused row kernels, split invariant matmul) under Triton's
    interpreter: bitwise the same alone and in the busy batch, and the torch steps'
    outputs to rounding."""
    from inferd.engine.runner.batch_invariant_fused import FusedInvariantOps

    alone, busy = alone_and_busy(tiny_model, "float32", True, FusedInvariantOps, requests=3, noise_count=4)
    assert busy == alone
    torch_alone, _ = alone_and_busy(tiny_model, "float32", True, requests=3, noise_count=1)
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(alone, torch_alone):
        assert tokens == want_tokens
        for got_step, want_step in zip(logprobs, want_logprobs):
            assert [t for t, _ in got_step] == [t for t, _ in want_step]
            torch.testing.assert_close([lp for _, lp in got_step], [lp for _, lp in want_step], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not has_triton(), reason="needs triton (pip) for its CPU interpreter")
def test_kernels_here_run_with_the_k_ordered_interpreter_dot():
    """The bitwise checks under the interpreter hold on any processor only with the dot of
    tests/interpreter_dot.py (numpy's rounds by shape on some BLAS kernels)."""
    from triton.runtime import interpreter

    assert getattr(interpreter.InterpreterBuilder.create_dot, "in_k_order", False)


def test_tiles_cover_every_row_once():
    tile = ROW_TILE["cpu"]
    rows = torch.arange(3 * tile + 5, dtype=torch.float32)[:, None].repeat(1, 4)
    calls = []

    def double(x):
        calls.append(x.shape[0])
        return (x * 2,)

    (out,) = tiled(double, tile, rows)
    assert torch.equal(out, rows * 2)
    assert calls == [tile] * 4  # the last tile padded to the same shape


def chunk_beside_decode_row() -> tuple:
    """A prefill chunk of 5 tokens over an 8-token cached prefix beside a decode row, GQA
    (4 query heads over 2 KV heads)."""
    gen = torch.Generator().manual_seed(0)
    block_size, kv_heads, heads, dim = 8, 2, 4, 16
    k_cache = torch.randn(6, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(6, block_size, kv_heads, dim, generator=gen)
    q = torch.randn(5 + 1, heads, dim, generator=gen)
    meta = AttentionMetadata(
        query_start=[0, 5],
        query_lens=[5, 1],
        context_lens=torch.tensor([13, 9]),
        block_tables=torch.tensor([[0, 1], [2, 3]]),
        slot_mapping=torch.zeros(6, dtype=torch.long),
        positions=torch.tensor([8, 9, 10, 11, 12, 8]),
        max_query_len=5,
        max_context_len=13,
    )
    return q, k_cache, v_cache, meta, dim**-0.5


def test_invariant_attention_matches_paged_attention():
    q, k_cache, v_cache, meta, scale = chunk_beside_decode_row()
    expected = paged_attention(q, k_cache, v_cache, meta, scale)
    torch.testing.assert_close(invariant_attention(q, k_cache, v_cache, meta, scale), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(
    not has_triton() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton (pip) with TRITON_INTERPRET=1 for its CPU interpreter",
)
def test_token_rows_through_the_decode_kernel():
    """The GPU form (every token a row of the Triton decode kernel, fixed splits), under
    Triton's interpreter: the reference path's result, and the decode row's output the
    same alone as beside the chunk."""
    q, k_cache, v_cache, meta, scale = chunk_beside_decode_row()
    expected = paged_attention(q, k_cache, v_cache, meta, scale)
    got = _token_rows_on_device(q, k_cache, v_cache, meta, scale)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    alone = AttentionMetadata(
        query_start=[0],
        query_lens=[1],
        context_lens=meta.context_lens[1:],
        block_tables=meta.block_tables[1:],
        slot_mapping=meta.slot_mapping[5:],
        positions=meta.positions[5:],
        max_query_len=1,
        max_context_len=9,
    )
    assert torch.equal(_token_rows_on_device(q[5:], k_cache, v_cache, alone, scale), got[5:])


def test_deterministic_refuses_tensor_parallelism():
    with pytest.raises(ValueError, match="deterministic needs tensor_parallel_size 1"):
        EngineConfig(model="m", deterministic=True, tensor_parallel_size=2)


@pytest.mark.skipif(
    not has_triton() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton (pip) with TRITON_INTERPRET=1 for its CPU interpreter",
)
def test_invariant_matmul_rows_do_not_depend_on_the_batch():
    """The GPU projections' kernel, under Triton's interpreter: x @ W.T + b to rounding,
    and row 3 bitwise the same in a batch of 70 (two row tiles) and alone."""
    from inferd.engine.fast_path.invariant_matmul import invariant_linear

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(70, 96, generator=gen)
    weight, bias = torch.randn(80, 96, generator=gen), torch.randn(80, generator=gen)
    batch = invariant_linear(x, weight, bias)
    torch.testing.assert_close(batch, torch.nn.functional.linear(x, weight, bias), rtol=1e-4, atol=1e-4)
    assert torch.equal(invariant_linear(x[3:4], weight, bias), batch[3:4])


@pytest.mark.skipif(
    not has_triton() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton (pip) with TRITON_INTERPRET=1 for its CPU interpreter",
)
def test_invariant_matmul_outputs_per_program():
    """block_n only spreads the outputs over programs: every width gives the product,
    bitwise the same (block_n_for follows the number of rows)."""
    from inferd.engine.fast_path.invariant_matmul import block_n_for, invariant_linear

    gen = torch.Generator().manual_seed(2)
    x, weight = torch.randn(5, 64, generator=gen), torch.randn(144, 64, generator=gen)
    expected = torch.nn.functional.linear(x, weight)
    widths = {block_n: invariant_linear(x, weight, block_n=block_n) for block_n in (16, 32, 64, 128)}
    for got in widths.values():
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        assert torch.equal(got, widths[16])
    with pytest.raises(ValueError, match="block_n must be a power of two of at least 16, got 24"):
        invariant_linear(x, weight, block_n=24)
    assert [block_n_for(1, 4096, 4096), block_n_for(1, 14336, 4096), block_n_for(1, 4096, 14336)] == [32, 64, 64]
    assert block_n_for(128, 4096, 4096) == 64
    assert block_n_for(256, 1024, 4096) == block_n_for(8192, 128256, 4096) == 128


@pytest.mark.skipif(
    not has_triton() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton (pip) with TRITON_INTERPRET=1 for its CPU interpreter",
)
def test_invariant_matmul_split_over_k():
    """K cut into parts summed in order: the product (with bias) for any part count,
    including parts past the end of K and a K that is no multiple of BLOCK_K, and a row
    bitwise the same alone and in the batch at the same part count."""
    from inferd.engine.fast_path.invariant_matmul import invariant_linear, split_k_for

    gen = torch.Generator().manual_seed(3)
    x, weight = torch.randn(70, 200, generator=gen), torch.randn(80, 200, generator=gen)
    bias = torch.randn(80, generator=gen)
    expected = torch.nn.functional.linear(x, weight, bias)
    for split_k in (1, 2, 3, 8):
        batch = invariant_linear(x, weight, bias, split_k=split_k)
        torch.testing.assert_close(batch, expected, rtol=1e-4, atol=1e-4)
        assert torch.equal(invariant_linear(x[3:4], weight, bias, split_k=split_k), batch[3:4])
    with pytest.raises(ValueError, match="split_k must be at least 1, got 0"):
        invariant_linear(x, weight, split_k=0)
    # llama3-8b-shape's fused q/k/v, o, gate/up, down and LM head; a K too short to cut
    shapes = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096), (64, 96)]
    assert [split_k_for(n, k) for n, k in shapes] == [2, 4, 1, 4, 1, 1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_invariant_sweep_refuses_cleanly_without_cuda(tmp_path):
    from inferd.engine.bench import invariant_sweep

    with pytest.raises(SystemExit, match="invariant_sweep needs a CUDA GPU"):
        invariant_sweep.main(["--out", str(tmp_path)])
