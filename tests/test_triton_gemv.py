"""The batch-1 GEMVs with RMSNorm / SiLU-and-multiply folded in (triton_gemv.py), under
Triton's CPU interpreter in float32 (the interpreter has no bfloat16 rounding), against
the unfused ops they replace; and the whole batch-1 decode step through them."""

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


def _case(n: int, k: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x, residual = torch.randn(1, k, generator=gen), torch.randn(1, k, generator=gen)
    norm = torch.rand(k, generator=gen) + 0.5
    weight = torch.randn(n, k, generator=gen) / k**0.5
    return x, residual, norm, weight


@needs_triton
@pytest.mark.parametrize("n, k", [(40, 256), (37, 176), (8, 64)])  # 37: rows past the last full program
def test_gemv_matches_linear(n, k):
    from inferd.engine.fast_path.triton_gemv import gemv

    x, _, _, weight = _case(n, k)
    torch.testing.assert_close(gemv(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-5)


@needs_triton
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_gemv_matches_the_ops_it_fuses(silu, with_residual):
    from inferd.engine.fast_path.fused_ops import add_rms_norm_reference, silu_and_mul_reference
    from inferd.engine.fast_path.triton_gemv import rms_norm_gemv

    x, residual, norm, weight = _case(2 * 36, 176, seed=int(silu) + 2 * int(with_residual))
    before = residual.clone()
    out, new_residual = rms_norm_gemv(x, residual if with_residual else None, norm, 1e-5, weight, silu_mul=silu)
    want_residual = before.clone() if with_residual else None
    hidden, want_new = add_rms_norm_reference(x, want_residual, norm, 1e-5)
    want = F.linear(hidden, weight)
    want = silu_and_mul_reference(want) if silu else want
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new_residual, want_new)
    assert torch.equal(residual, before)  # a new tensor, not an in-place update
    assert (new_residual is x) == (not with_residual)


@needs_triton
def test_output_dtype_can_differ_from_the_weights_like_compute_logits_float():
    from inferd.engine.fast_path.triton_gemv import gemv

    x, _, _, weight = _case(24, 64)
    out = gemv(x, weight, out_dtype=torch.float64)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, F.linear(x, weight).double(), rtol=1e-5, atol=1e-5)


@needs_triton
def test_bad_shapes_are_refused_with_what_was_wrong():
    from inferd.engine.fast_path.triton_gemv import GemvConfig, gemv, rms_norm_gemv

    x, residual, norm, weight = _case(16, 64)
    with pytest.raises(ValueError, match="one row"):
        gemv(torch.randn(2, 64), weight)
    with pytest.raises(ValueError, match=r"weight must be \[N, 64\]"):
        gemv(x, weight.T.contiguous().T)
    with pytest.raises(ValueError, match="multiple of block_k"):
        gemv(x, weight, config=GemvConfig(block_k=128))
    with pytest.raises(ValueError, match="norm weight"):
        rms_norm_gemv(x, residual, norm[:10], 1e-5, weight)
    with pytest.raises(ValueError, match="even number of rows"):
        rms_norm_gemv(x, residual, norm, 1e-5, weight[:15], silu_mul=True)
    with pytest.raises(ValueError, match="power of two"):
        GemvConfig(block_n=6)


def test_launch_shapes_divide_k_or_are_refused():
    from inferd.engine.fast_path.triton_gemv import DEFAULT_CONFIG, LONG_ROW_CONFIG, choose_config

    assert choose_config(6144, 4096).block_n == 16  # measured on the H200
    assert choose_config(6144, 6144) == DEFAULT_CONFIG  # not measured: the rule
    assert choose_config(4096, 14336) == LONG_ROW_CONFIG
    assert choose_config(512, 176).block_k == 16  # 176 = 11 x 16
    assert choose_config(512, 100) is None  # 100 = 25 x 4: no factor of 16


@needs_triton
@pytest.mark.slow
def test_batch1_decode_through_fused_gemvs_matches_portable_path(tiny_model, monkeypatch):
    from inferd.engine.fast_path import hot_kv_layers
    from inferd.engine.fast_path.cuda_graphs import DecodeGraphs
    from inferd.engine.fast_path.fast_decoder import Batch1Ops, FastDecoder
    from tests.test_fast_path import assert_same_completion

    used = []
    logits = Batch1Ops.logits
    monkeypatch.setattr(Batch1Ops, "logits", lambda self, *a: used.append(1) or logits(self, *a))
    expected = LLM(tiny_model, mode="fallback", block_size=8)
    llm = LLM(tiny_model, block_size=8)
    runner = llm.engine.runner
    decoder = FastDecoder(runner.model, hot_kv_layers(runner))
    assert decoder.batch1_gemv
    runner.fast_decode = DecodeGraphs(decoder, 8, 256, runner.device, pages=runner.pages, use_graphs=False)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=3)
    prompt = [[5, 6, 7, 8, 9, 10, 11, 12, 13]]
    got = llm.generate(prompt, params)[0].outputs[0]
    want = expected.generate(prompt, params)[0].outputs[0]
    assert len(used) == 4  # every decode step after the prefill
    assert_same_completion(got, want)


@needs_triton
@pytest.mark.parametrize("slot", [13, -1])  # -1: a padded graph row writes no K/V
def test_qkv_rope_kernel_matches_norm_gemv_then_rope_and_cache(slot):
    from inferd.engine.fast_path.fused_ops import rope_and_cache_reference
    from inferd.engine.fast_path.triton_gemv import rms_norm_gemv, rms_norm_qkv_rope

    heads, kv_heads, dim, hidden = 4, 2, 16, 64
    x, residual, norm, weight = _case((heads + 2 * kv_heads) * dim, hidden, seed=slot)
    positions, slots = torch.tensor([37]), torch.tensor([slot])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    arena = torch.randn(6, 2, 8, kv_heads, dim)  # pages of 8 tokens; K and V share strides
    untouched, got_arena = arena.clone(), arena.clone()
    qkv, new_residual = rms_norm_qkv_rope(
        x, residual, norm, 1e-5, weight, heads, kv_heads, positions, inv_freq, got_arena[:, 0], got_arena[:, 1], slots
    )
    want, want_residual = rms_norm_gemv(x, residual, norm, 1e-5, weight)
    q = want[:, : heads * dim].view(1, heads, dim)
    k = want[:, heads * dim : (heads + kv_heads) * dim].view(1, kv_heads, dim)
    v = want[:, (heads + kv_heads) * dim :].view(1, kv_heads, dim)
    rope_and_cache_reference(q, k, v, positions, inv_freq, arena[:, 0], arena[:, 1], slots)
    torch.testing.assert_close(qkv[:, : heads * dim], q.reshape(1, -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_arena, arena, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new_residual, want_residual)
    assert torch.equal(got_arena, untouched) == (slot < 0)


def test_programmatic_dependent_launch_only_where_it_can_run(monkeypatch):
    from inferd.engine.fast_path.pdl import pdl_enabled, pdl_launch

    assert pdl_launch(torch.device("cpu")) == {"USE_PDL": False}  # no launch_pdl keyword at all
    monkeypatch.setenv("INFERD_PDL", "0")
    assert not pdl_enabled(torch.device("cuda"))


def test_pdl_asks_the_device_once_and_the_switch_at_every_launch(monkeypatch):
    from inferd.engine.fast_path import pdl

    asked = []
    monkeypatch.setattr(pdl, "gdc_wait", pdl.gdc_wait or object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (asked.append(device), (9, 0))[1])
    monkeypatch.delenv("INFERD_PDL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    device = torch.device("cuda", 7)
    pdl._device_has_pdl.cache_clear()
    try:
        assert all(pdl.pdl_enabled(device) for _ in range(3))
        monkeypatch.setenv("INFERD_PDL", "0")
        assert not pdl.pdl_enabled(device)
        assert asked == [device]
    finally:
        pdl._device_has_pdl.cache_clear()  # the answers above were the fakes'


def test_host_grid_arithmetic_matches_tritons():
    """launch_shape's cdiv and next_power_of_2 stand in for Triton's in host code."""
    triton = pytest.importorskip("triton", reason="needs triton (pip) to compare with")
    from inferd.engine.fast_path.launch_shape import cdiv, next_power_of_2

    for n in range(1, 5000):
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for block in (1, 3, 16, 1024):
            assert cdiv(n, block) == triton.cdiv(n, block), (n, block)


def test_early_release_follows_pdl_and_its_setting(monkeypatch):
    from inferd.engine.fast_path import pdl

    cpu = torch.device("cpu")
    monkeypatch.delenv("INFERD_PDL_RELEASE", raising=False)  # default: after the loops
    # Without PDL there is nothing to release early.
    assert pdl.pdl_launch(cpu, releases=True) == {"USE_PDL": False, "EARLY_RELEASE": False}
    monkeypatch.setattr(pdl, "pdl_enabled", lambda device: True)
    assert pdl.pdl_launch(cpu, releases=True) == {"USE_PDL": True, "launch_pdl": True, "EARLY_RELEASE": True}
    monkeypatch.setenv("INFERD_PDL_RELEASE", "exit")
    assert pdl.pdl_launch(cpu, releases=True)["EARLY_RELEASE"] is False
    monkeypatch.setenv("INFERD_PDL_RELEASE", "early")
    with pytest.raises(ValueError, match="INFERD_PDL_RELEASE must be 'exit' or 'loop', got 'early'"):
        pdl.pdl_launch(cpu, releases=True)
