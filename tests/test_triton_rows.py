"""The few-row products with SiLU-and-multiply / RoPE and the K/V write folded in
(triton_rows.py), under Triton's CPU interpreter in float32 (the interpreter has no
bfloat16 rounding), against the unfused ops they replace; and whole decode steps of a
few rows through them against the portable path."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch
import torch.nn.functional as F

from inferd.engine import LLM, SamplingParams
from inferd.engine.fast_path import has_triton

needs_triton = pytest.mark.skipif(
    not has_triton() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton (pip) with TRITON_INTERPRET=1 for its CPU interpreter",
)
TOL = dict(rtol=1e-4, atol=1e-4)  # the interpreter's float32 dots sum in another order than torch


def _case(m: int, n: int, k: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x, residual = torch.randn(m, k, generator=gen), torch.randn(m, k, generator=gen)
    norm = torch.rand(k, generator=gen) + 0.5
    weight = torch.randn(n, k, generator=gen) / k**0.5
    return x, residual, norm, weight


@needs_triton
@pytest.mark.parametrize("m, n, k", [(2, 64, 256), (5, 37, 128), (17, 40, 128), (64, 16, 128)])
def test_rows_gemm_matches_linear(m, n, k):  # 37, 40: columns past the last full program; 5, 17: padded rows
    from inferd.engine.fast_path.triton_rows import rows_gemm

    x, _, _, weight = _case(m, n, k)
    torch.testing.assert_close(rows_gemm(x, weight), F.linear(x, weight), **TOL)


@needs_triton
@pytest.mark.parametrize("m", [3, 20])
def test_rows_gemm_with_silu_matches_linear_then_silu_and_mul(m):
    from inferd.engine.fast_path.fused_ops import silu_and_mul_reference
    from inferd.engine.fast_path.triton_rows import rows_gemm

    x, _, _, weight = _case(m, 2 * 40, 256, seed=m)  # 40 outputs: the last program's columns are masked
    torch.testing.assert_close(rows_gemm(x, weight, silu_mul=True), silu_and_mul_reference(F.linear(x, weight)), **TOL)


@needs_triton
@pytest.mark.parametrize("split_k, silu_mul", [(2, False), (4, False), (2, True)])
def test_rows_gemm_split_over_k_matches_linear_and_rearms_its_counters(split_k, silu_mul):
    from inferd.engine.fast_path.attention import split_counters
    from inferd.engine.fast_path.fused_ops import silu_and_mul_reference
    from inferd.engine.fast_path.triton_rows import RowsConfig, rows_gemm

    x, _, _, weight = _case(5, 2 * 40, 256, seed=split_k)  # 40 / 80 outputs: masked columns in the last tile
    config = RowsConfig(block_n=16, block_k=32, split_k=split_k)
    got = rows_gemm(x, weight, silu_mul=silu_mul, config=config)
    product = F.linear(x, weight)
    torch.testing.assert_close(got, silu_and_mul_reference(product) if silu_mul else product, **TOL)
    assert split_counters(x.device, 1).count_nonzero() == 0  # the last split of each tile re-armed its counter
    assert torch.equal(rows_gemm(x, weight, silu_mul=silu_mul, config=config), got)  # summed in split order


@needs_triton
def test_rows_output_dtype_can_differ_from_the_weights_like_compute_logits_float():
    from inferd.engine.fast_path.triton_rows import rows_gemm

    x, _, _, weight = _case(4, 48, 128)
    out = rows_gemm(x, weight, out_dtype=torch.float64)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, F.linear(x, weight).double(), **TOL)


@needs_triton
@pytest.mark.parametrize("head_dim, split_k", [(32, 1), (64, 1), (32, 2)])
def test_rows_qkv_rope_matches_linear_then_rope_and_cache(head_dim, split_k):
    from inferd.engine.fast_path.fused_ops import rope_and_cache_reference
    from inferd.engine.fast_path.triton_rows import RowsConfig, rows_qkv_rope

    heads, kv_heads, hidden = 4, 2, 128
    x, _, _, weight = _case(3, (heads + 2 * kv_heads) * head_dim, hidden, seed=head_dim)
    positions, slots = torch.tensor([37, 5, 90]), torch.tensor([13, -1, 40])  # -1: a padded graph row
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    arena = torch.randn(6, 2, 8, kv_heads, head_dim)  # pages of 8 tokens; K and V share strides
    got_arena, untouched = arena.clone(), arena.clone()
    config = RowsConfig(block_n=32, block_k=32, split_k=split_k)
    qkv = rows_qkv_rope(
        x, weight, heads, kv_heads, positions, inv_freq, got_arena[:, 0], got_arena[:, 1], slots, config=config
    )
    want = F.linear(x, weight)
    q = want[:, : heads * head_dim].view(3, heads, head_dim)
    k = want[:, heads * head_dim : (heads + kv_heads) * head_dim].view(3, kv_heads, head_dim)
    v = want[:, (heads + kv_heads) * head_dim :].view(3, kv_heads, head_dim)
    rope_and_cache_reference(q, k, v, positions, inv_freq, arena[:, 0], arena[:, 1], slots)
    torch.testing.assert_close(qkv[:, : heads * head_dim], q.reshape(3, -1), **TOL)
    torch.testing.assert_close(qkv[:, (heads + kv_heads) * head_dim :], v.reshape(3, -1), **TOL)
    torch.testing.assert_close(got_arena, arena, **TOL)  # rows 0 and 2 written, nothing for row 1
    written = got_arena != untouched
    assert written[1, :, 5].all() and written[5, :, 0].all()  # slots 13 and 40, pages of 8
    assert written.sum() == 2 * 2 * kv_heads * head_dim  # k and v of two rows, nothing else


@needs_triton
def test_bad_shapes_are_refused_with_what_was_wrong():
    from inferd.engine.fast_path.triton_rows import RowsConfig, rows_gemm, rows_qkv_rope

    x, _, _, weight = _case(4, 32, 128)
    with pytest.raises(ValueError, match="1-64 rows"):
        rows_gemm(torch.randn(65, 128), weight)
    with pytest.raises(ValueError, match=r"weight must be \[N, 128\]"):
        rows_gemm(x, weight.T.contiguous().T)
    with pytest.raises(ValueError, match="multiple of block_k"):
        rows_gemm(x, weight, config=RowsConfig(block_k=256))  # 128 columns
    with pytest.raises(ValueError, match="even number of rows"):
        rows_gemm(x, weight[:31], silu_mul=True)
    with pytest.raises(ValueError, match="power of two of at least 16"):
        RowsConfig(block_n=8)
    with pytest.raises(ValueError, match="split_k must be a power of two"):
        RowsConfig(split_k=3)
    with pytest.raises(ValueError, match="block_k=64 x split_k=4"):
        rows_gemm(x, weight, config=RowsConfig(block_k=64, split_k=4))  # 128 columns
    cache = torch.zeros(2, 8, 1, 32)
    with pytest.raises(ValueError, match="fused q/k/v weight has 128 rows"):
        rows_qkv_rope(x, weight, 2, 1, torch.zeros(4), torch.ones(16), cache, cache, torch.zeros(4))


def test_rows_launch_shapes_pad_rows_and_divide_k_or_are_refused(monkeypatch):
    from inferd.engine.fast_path.triton_rows import (
        DEFAULT_CONFIG,
        MEASURED_CONFIGS,
        RowsConfig,
        block_rows,
        choose_config,
        qkv_pairs,
    )

    assert [block_rows(m) for m in (1, 2, 16, 17, 33, 64)] == [16, 16, 16, 32, 64, 64]
    with pytest.raises(ValueError, match="1-64"):
        block_rows(65)
    assert choose_config(4096, 4096 + 64, 8).block_k == 64  # 4160 = 65 x 64
    assert choose_config(512, 100, 8) is None  # 100 = 25 x 4: no factor of 16
    assert choose_config(512, 256, 8) == DEFAULT_CONFIG  # not measured: the default
    with monkeypatch.context() as patch:  # block_k halves until block_k * split_k divides k
        patch.setitem(MEASURED_CONFIGS, (512, 256, 16), RowsConfig(block_k=128, split_k=4))
        assert choose_config(512, 256, 8).block_k == 64
    assert choose_config(4096, 4096, 3).block_n == 32  # measured on the H200
    assert choose_config(4096, 4096, 40) is None  # o at 64 rows: cuBLAS measured faster
    assert choose_config(4096, 14336, 40).split_k == 2  # down at 64 rows: split over K measured faster
    assert choose_config(6144, 4096, 64) is not None  # q/k/v has a shape at every row count
    assert qkv_pairs(128, DEFAULT_CONFIG) == 32  # block_n 64: 32 pairs
    assert qkv_pairs(32, DEFAULT_CONFIG) == 16  # at most half the head dim
    assert qkv_pairs(20, DEFAULT_CONFIG) == 0  # 10 dims: narrower than a dot


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize("cublas_plain_products", [False, True])  # as the 8B shape's o/down at 64 rows
def test_few_row_decode_through_fused_rows_matches_portable_path(model_factory, monkeypatch, cublas_plain_products):
    from inferd.engine.fast_path import hot_kv_layers
    from inferd.engine.fast_path.cuda_graphs import DecodeGraphs
    from inferd.engine.fast_path.fast_decoder import FastDecoder, RowsOps
    from tests.test_fast_path import assert_same_completion

    # head dim 32: the tiny preset's 16 is too narrow for the q/k/v kernel's dots of pairs
    tiny_model = model_factory(preset="tiny", overrides={"hidden_size": 128, "intermediate_size": 256})
    if cublas_plain_products:  # o [128, 128] and down [128, 256] fall back to F.linear
        from inferd.engine.fast_path import triton_rows

        for key in ((128, 128, 16), (128, 256, 16)):
            monkeypatch.setitem(triton_rows.MEASURED_CONFIGS, key, None)
    used = []
    logits = RowsOps.logits
    monkeypatch.setattr(RowsOps, "logits", lambda self, *a: used.append(1) or logits(self, *a))
    expected = LLM(tiny_model, mode="fallback", block_size=8)
    llm = LLM(tiny_model, block_size=8)
    runner = llm.engine.runner
    decoder = FastDecoder(runner.model, hot_kv_layers(runner))
    assert decoder.rows_gemm
    runner.fast_decode = DecodeGraphs(decoder, 8, 256, runner.device, pages=runner.pages, use_graphs=False)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=3)
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [20, 21, 22], [40]]
    got = [r.outputs[0] for r in llm.generate(prompts, params)]
    want = [r.outputs[0] for r in expected.generate(prompts, params)]
    assert used  # the decode steps of three rows ran through RowsOps
    for g, w in zip(got, want):
        assert_same_completion(g, w)
