"""Hot/cold KV quantization: quantizer error, attention over cold blocks, end-to-end
agreement with full-precision KV, capacity, run-time switching and swap.

Bounds enforced here (and reported in BENCHMARKS.md):
- round trip on N(0, 1) data against float64: every element within half a scale step;
  relative Frobenius error <= 1e-2 (int8), <= 0.12 (int4);
- attention over contexts crossing block and hot/cold boundaries: relative error of
  the output <= 2e-2 (int8), <= 0.2 (int4; 0.15 measured at 64 tokens, random data);
- end to end on the tiny random checkpoint (hot window 16, block 8, 32 greedy tokens):
  int8 agrees on all 32 tokens for every prompt and its last-token log-probabilities
  are within 1e-2 relative; int4 agrees on at least 8 tokens on average, log-probs
  within 0.08 relative (int4 KV on a random 16-dim-head model is coarse: the numbers
  say how coarse);
- capacity of 2,048-token sequences at a fixed budget, hot window 128, float32 KV:
  >= 1.9x (int8) and >= 3.5x (int4).
"""

from __future__ import annotations

import random

import pytest
import torch

from inferd.engine import LLM, EngineConfig, LLMEngine, SamplingParams
from inferd.engine.bench.kv_capacity import capacity_table
from inferd.engine.kv.block_pool import KIND_CODE
from inferd.engine.kv.kv_cache import KVCache, KVShape
from inferd.engine.kv.kv_quant import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8
from inferd.engine.model.attention import AttentionMetadata, paged_attention, write_kv


@pytest.mark.parametrize("head_dim", [16, 128])
def test_int8_round_trip(head_dim):
    x = torch.randn(5, 16, 4, head_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(head_dim))
    q, scale = quantize_int8(x)
    y = dequantize_int8(q, scale, torch.float64)
    assert q.dtype == torch.int8 and scale.shape == (5, 4)
    assert ((y - x).abs() <= scale[:, None, :, None] / 2 + 1e-12).all()
    assert (y - x).norm() / x.norm() <= 1e-2


@pytest.mark.parametrize("head_dim", [16, 128, 256])
def test_int4_round_trip_packs_two_per_byte(head_dim):
    x = torch.randn(5, 16, 4, head_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(head_dim))
    packed, scale = quantize_int4(x)
    y = dequantize_int4(packed, scale, torch.float64)
    assert packed.dtype == torch.uint8 and packed.shape[-1] == head_dim // 2
    group = head_dim // scale.shape[-1]
    step = scale.double().repeat_interleave(group, dim=-1)
    assert ((y - x).abs() <= step / 2 * (1 + 2**-10) + 1e-12).all()
    assert (y - x).norm() / x.norm() <= 0.12


@pytest.mark.parametrize("kind, bound", [("int8", 2e-2), ("int4", 0.2)])
def test_attention_over_cold_blocks(kind, bound):
    torch.manual_seed(0)
    bs, kvh, hd, heads = 8, 2, 32, 4
    ctx_lens = [1, 7, 8, 9, 24, 40, 64]
    pages_per_seq = [-(-n // bs) for n in ctx_lens]
    cache = KVCache(1, sum(pages_per_seq) * 2 + 8, 0, bs, kvh, hd, torch.float32, torch.device("cpu"), None, (kind,))
    k, v, cold = cache.layer_views(0)
    slots_per_page = cache.shape.slots_per_page()[kind]
    tables, kinds, slot_ids, next_page, next_cold = [], [], [], 0, sum(pages_per_seq)
    quantize_pairs, cold_used = [], 0
    hot_window = 8
    for n, pages in zip(ctx_lens, pages_per_seq):
        row, krow, srow = [], [], []
        for j in range(pages):
            page = next_page
            next_page += 1
            row.append(page)
            krow.append(0)
            srow.append(0)
            if (j + 1) * bs <= n - hot_window:  # all tokens older than the window: cold
                cold_page, slot = next_cold + cold_used // slots_per_page, cold_used % slots_per_page
                cold_used += 1
                quantize_pairs.append((page, (kind, cold_page, slot)))
                row[-1], krow[-1], srow[-1] = cold_page, KIND_CODE[kind], slot
        tables.append(row)
        kinds.append(krow)
        slot_ids.append(srow)
    # fill every token's K/V at its hot page, keep the hot copy as the reference
    hot_tables = [[p for p in range(sum(pages_per_seq[:i]), sum(pages_per_seq[: i + 1]))] for i in range(len(ctx_lens))]
    slots = torch.tensor([hot_tables[i][t // bs] * bs + t % bs for i, n in enumerate(ctx_lens) for t in range(n)])
    write_kv(k, v, torch.randn(len(slots), kvh, hd), torch.randn(len(slots), kvh, hd), slots)
    cache.quantize(quantize_pairs)

    def meta_for(tabs, kinds_t=None, slots_t=None):
        width = max(map(len, tabs))
        pad = lambda rows: torch.tensor([r + [0] * (width - len(r)) for r in rows])  # noqa: E731
        return AttentionMetadata(
            query_start=list(range(len(ctx_lens))),
            query_lens=[1] * len(ctx_lens),
            context_lens=torch.tensor(ctx_lens),
            block_tables=pad(tabs),
            slot_mapping=torch.zeros(0, dtype=torch.long),
            positions=torch.tensor([n - 1 for n in ctx_lens]),
            max_query_len=1,
            max_context_len=max(ctx_lens),
            block_kinds=None if kinds_t is None else pad(kinds_t),
            block_slots=None if slots_t is None else pad(slots_t),
        )

    q = torch.randn(len(ctx_lens), heads, hd)
    ref = paged_attention(q, k, v, meta_for(hot_tables), hd**-0.5)
    got = paged_attention(q, k, v, meta_for(tables, kinds, slot_ids), hd**-0.5, cold=cold)
    assert cold_used > 0
    for i, n in enumerate(ctx_lens):
        err = (got[i] - ref[i]).norm() / ref[i].norm()
        if n <= hot_window:
            assert err < 1e-6, (n, err)  # nothing cold
        else:
            assert err <= bound, (n, err)


PROMPTS_SEED = 0


def _prompts():
    rng = random.Random(PROMPTS_SEED)
    return [[rng.randrange(5, 500) for _ in range(rng.randrange(40, 120))] for _ in range(6)]


@pytest.mark.parametrize("kind, min_mean_agreement, logprob_bound", [("int8", 32, 1e-2), ("int4", 8, 0.08)])
def test_end_to_end_against_full_precision(tiny_model, kind, min_mean_agreement, logprob_bound):
    prompts = _prompts()
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    config = dict(block_size=8, max_num_batched_tokens=32, enable_prefix_caching=False)
    full = LLM(tiny_model, **config)
    quant = LLM(tiny_model, kv_cold_dtype=kind, kv_hot_window=16, **config)
    base = [o.outputs[0].token_ids for o in full.generate(prompts, greedy)]
    outs = [o.outputs[0].token_ids for o in quant.generate(prompts, greedy)]
    agreement = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), 32) for x, y in zip(base, outs)]
    assert sum(agreement) / len(agreement) >= min_mean_agreement, agreement
    assert quant.engine.counters.quantized_blocks[kind] > 0
    lp = SamplingParams(temperature=0.0, max_tokens=1, logprobs=20)
    for prompt in prompts:
        a = full.generate([prompt], lp)[0].outputs[0].logprobs[0]
        b = quant.generate([prompt], lp)[0].outputs[0].logprobs[0]
        common = [t for t in a if t in b]
        va, vb = torch.tensor([a[t] for t in common]), torch.tensor([b[t] for t in common])
        assert len(common) >= 10 and (va - vb).norm() / va.norm() <= logprob_bound


def test_capacity_gain_at_fixed_budget():
    shape = KVShape(num_layers=2, block_size=16, num_kv_heads=2, head_dim=16, dtype=torch.float32)
    table = capacity_table(shape, 32 << 20, seq_len=2048, hot_window=128)
    assert table["none"] > 0
    assert table["int8"] / table["none"] >= 1.9
    assert table["int4"] / table["none"] >= 3.5


def test_engine_budget_fits_more_blocks_with_cold_kv(tiny_model):
    base = LLMEngine(EngineConfig(model=tiny_model, block_size=8, kv_cache_bytes=4 << 20, kv_hot_window=16))
    cold = LLMEngine(
        EngineConfig(model=tiny_model, block_size=8, kv_cache_bytes=4 << 20, kv_hot_window=16, kv_cold_dtype="int8")
    )
    p = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for engine in (base, cold):
        for i in range(4):
            engine.add_request(f"r{i}", list(range(5, 205)), p)
        engine.step()
        engine.step()
    # same requests, same budget: cold KV leaves more pages free
    assert cold.kv_snapshot().num_free > base.kv_snapshot().num_free
    snap = cold.kv_snapshot()
    assert snap.blocks_by_dtype["int8"] > 0 and snap.bytes_saved > 0


def test_switching_at_run_time_affects_new_cold_blocks_only(tiny_model):
    engine = LLMEngine(EngineConfig(model=tiny_model, block_size=8, kv_hot_window=8, max_num_batched_tokens=16))
    p = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    engine.add_request("a", list(range(5, 60)), p)
    for _ in range(3):
        engine.step()
    assert engine.kv_snapshot().blocks_by_dtype == {"hot": 6, "int8": 0, "int4": 0}  # 48 of 55 prompt tokens
    engine.reconfigure({"kv_cold_dtype": "int8"})
    engine.step()
    int8_blocks = engine.kv_snapshot().blocks_by_dtype["int8"]
    assert int8_blocks > 0
    engine.reconfigure({"kv_cold_dtype": "int4"})
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
        by = engine.kv_snapshot().blocks_by_dtype
        if engine.has_unfinished():
            assert by["int8"] == int8_blocks  # never re-quantized
    assert engine.counters.quantized_blocks["int4"] > 0
    final = outs[-1].outputs[0]
    assert final.finish_reason == "length" and len(final.token_ids) == 40
    assert engine.config.mode == "fast"  # no non-finite logits along the way


def test_swap_moves_cold_blocks_compactly(tiny_model):
    probe = LLMEngine(EngineConfig(model=tiny_model, block_size=8))
    bb = probe.block_bytes
    llm = LLM(
        tiny_model,
        block_size=8,
        kv_cache_bytes=16 * bb,
        swap_space_bytes=64 * bb,
        watermark=0.0,
        kv_cold_dtype="int8",
        kv_hot_window=8,
        preemption_mode="swap",
        max_num_batched_tokens=32,
    )
    prompts = [list(range(5 + i, 45 + i)) for i in range(5)]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 24 for o in outs)
    c = llm.engine.counters
    assert c.swap_in_faults > 0
    # cold blocks travel at a quarter of a float32 page (plus scales), so bytes per block fall below a page
    assert 0 < c.swap_out_bytes < (c.swap_out_bytes // bb + 1) * bb
    assert c.swap_out_bytes % bb != 0


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_per_block_copy_moves_cold_slots_byte_for_byte(kind):
    """The host<->device swap path (one contiguous copy per block, run here between two
    CPU arenas) carries a cold block's codes and scales exactly, whatever the layout."""
    from inferd.engine.kv.kv_cache import KVCache, _Arena

    cache = KVCache(2, 8, 0, 4, 2, 16, torch.float32, torch.device("cpu"), None, (kind,))
    cache.device_pool.hot.normal_()
    cache.quantize([(0, (kind, 5, 1)), (1, (kind, 6, 0))])
    dst = _Arena(cache.shape, 4, torch.device("cpu"), None, (kind,))
    KVCache._copy(
        cache.device_pool,
        dst,
        [((kind, 5, 1), (kind, 2, 3)), ((kind, 6, 0), (kind, 0, 0))],
        non_blocking=False,
        per_block=True,
    )
    data, scales = (kind, "scales8" if kind == "int8" else "scales4")
    src_data, dst_data = getattr(cache.device_pool, data), getattr(dst, data)
    src_scales, dst_scales = getattr(cache.device_pool, scales), getattr(dst, scales)
    assert torch.equal(dst_data[2, 3], src_data[5, 1]) and torch.equal(dst_data[0, 0], src_data[6, 0])
    assert torch.equal(dst_scales[2, 3], src_scales[5, 1]) and torch.equal(dst_scales[0, 0], src_scales[6, 0])
    assert src_data[5, 1].abs().sum() > 0 and dst_data[1, 0].abs().sum() == 0  # untouched slots stay empty
