"""The decode kernels' in-kernel merge: the last split of each (sequence, KV head) to
finish merges the partial outputs and re-arms its counter (Triton's CPU interpreter)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from inferd.engine.fast_path import has_triton
from tests.test_fast_path import _arena

from attention_reference import reference_attention

needs_triton = pytest.mark.skipif(
    not has_triton() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton (pip) with TRITON_INTERPRET=1 for its CPU interpreter",
)


def _poison_split_buffers(monkeypatch, module) -> None:
    """Make `module`'s split_buffers hand out partial buffers full of NaN, so that a merge
    reading a partial no split wrote in this launch shows in the output."""
    split_buffers = module.split_buffers

    def poisoned(q, num_splits):
        out, part, lse = split_buffers(q, num_splits)
        part.fill_(float("nan"))
        lse.fill_(float("nan"))
        return out, part, lse

    monkeypatch.setattr(module, "split_buffers", poisoned)


@needs_triton
def test_counters_return_to_zero_so_every_later_launch_merges_again():
    from inferd.engine.fast_path.attention import paged_decode_attention, split_counters

    gen = torch.Generator().manual_seed(3)
    _, k_cache, v_cache = _arena(24, 2, 16, 2, 32)
    ctx = torch.tensor([300, 17, 0])
    tables = torch.stack([torch.randperm(24, generator=gen)[:20] for _ in ctx]).to(torch.int32)
    q = torch.randn(len(ctx), 4, 32, generator=gen)
    ref = reference_attention(q, k_cache, v_cache, tables, ctx, 0.3)
    outs = [paged_decode_attention(q, k_cache, v_cache, tables, ctx, 0.3, 4) for _ in range(3)]
    assert split_counters(q.device, 1).count_nonzero() == 0
    for out in outs:
        assert (out.double() - ref).norm() / ref.norm() < 1e-5
    # a larger launch grows the buffer; the earlier one is kept (graphs may point at it)
    first = split_counters(q.device, 1)
    grown = split_counters(q.device, first.numel() + 1)
    assert grown.numel() > first.numel() and grown.count_nonzero() == 0


@needs_triton
@pytest.mark.parametrize("window, inputs_ready", [(None, False), (50, False), (None, True)])
def test_short_contexts_merge_only_the_splits_that_hold_keys(window, inputs_ready, monkeypatch):
    """Graphs fix the split count for the longest context: at short contexts most splits
    are empty, do nothing, and are left out of the merge (their partial buffers keep
    whatever was there: NaN here); the counters still return to zero."""
    from inferd.engine.fast_path.attention import hot, paged_decode_attention, split_counters

    _poison_split_buffers(monkeypatch, hot)
    gen = torch.Generator().manual_seed(5)
    _, k_cache, v_cache = _arena(80, 2, 16, 2, 32)
    ctx = torch.tensor([1000, 40, 0, 130, 1])  # 16 splits of 64 keys: all, 1, (1), 3 and 1 of them used
    tables = torch.stack([torch.randperm(80, generator=gen)[:64] for _ in ctx]).to(torch.int32)
    q = torch.randn(len(ctx), 4, 32, generator=gen)
    ref = reference_attention(q, k_cache, v_cache, tables, ctx, 0.3, window)
    for _ in range(2):
        out = paged_decode_attention(q, k_cache, v_cache, tables, ctx, 0.3, 16, window, inputs_ready=inputs_ready)
        assert torch.isfinite(out).all() and out[2].abs().max() == 0
        assert (out.double() - ref).norm() / ref.norm() < 1e-5
    assert split_counters(q.device, 1).count_nonzero() == 0


@needs_triton
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_cold_prefix_kernel_merges_its_splits_in_the_kernel(kind, monkeypatch):
    """The cold-prefix kernel merges as the hot one does: the last split with keys of each
    (sequence, KV head) to finish writes the output, reading only partials written in this
    launch (the buffers start as NaN here), and the counters are zero after every launch."""
    from inferd.engine.fast_path.attention import cold_prefix as cold_module
    from inferd.engine.fast_path.attention import split_counters
    from inferd.engine.kv.block_pool import KIND_CODE
    from inferd.engine.model.attention import paged_attention
    from tests.test_fast_path import _cold_case

    _poison_split_buffers(monkeypatch, cold_module)
    gen = torch.Generator().manual_seed(11)
    ctx = [300, 40, 0, 9]
    k, v, cold, meta, (tables, kinds, slots) = _cold_case(
        gen, 32, ctx, num_pages=160, first_cold_page={kind: 60}, kind_of=lambda i, j: kind
    )
    q = torch.randn(len(ctx), 4, 32, generator=gen)
    ref = paged_attention(q, k, v, meta, 0.3, cold=cold)
    for splits in (4, 16, 16):  # 16 splits of 32 keys: 10, 2, (1) and 1 of them used
        out = cold_module.cold_prefix_decode_attention(
            q,
            k,
            v,
            cold,
            tables.int(),
            slots.int(),
            (kinds != 0).sum(1),
            KIND_CODE[kind],
            torch.tensor(ctx),
            0.3,
            splits,
            tile=32,
        )
        assert split_counters(q.device, 1).count_nonzero() == 0
        assert torch.isfinite(out).all() and out[2].abs().max() == 0
        assert (out - ref).norm() / ref.norm() < 1e-5


@needs_triton
@pytest.mark.parametrize("splits", [2, 4])
def test_mixed_cold_kernel_merges_its_splits_in_the_kernel(splits, monkeypatch):
    """The kernel for any mix of hot, int8 and int4 blocks merges its splits as the
    others do (no second launch): only partials written in this launch are read (the
    buffers start as NaN) and the counters are zero after every launch."""
    from inferd.engine.fast_path.attention import mixed_cold, split_counters
    from inferd.engine.model.attention import paged_attention
    from tests.test_fast_path import _cold_case

    _poison_split_buffers(monkeypatch, mixed_cold)
    gen = torch.Generator().manual_seed(13)
    ctx = [70, 40, 0, 9]
    k, v, cold, meta, (tables, kinds, slots) = _cold_case(
        gen,
        32,
        ctx,
        num_pages=64,
        first_cold_page={"int8": 40, "int4": 52},
        kind_of=lambda i, j: ("int8", "int4")[(i + j) % 2],
    )
    q = torch.randn(len(ctx), 4, 32, generator=gen)
    ref = paged_attention(q, k, v, meta, 0.3, cold=cold)
    for _ in range(2):
        out = mixed_cold.cold_paged_decode_attention(
            q, k, v, cold, tables.int(), kinds, slots, torch.tensor(ctx), 0.3, splits
        )
        assert split_counters(q.device, 1).count_nonzero() == 0
        assert torch.isfinite(out).all() and out[2].abs().max() == 0
        assert (out - ref).norm() / ref.norm() < 1e-5


def test_split_counts_fill_two_waves_for_decode_rows_and_one_for_chunk_packs():
    from inferd.engine.fast_path.attention import choose_num_splits, chunk_num_splits

    # 8 KV heads, a 40,960-token limit: decode rows of 8 / 32 / 256 sequences
    assert [choose_num_splits(b, 8, 40960) for b in (8, 32, 256)] == [8, 2, 1]
    # chunk rows of 32 / 64 / 128 tokens in packs of 4: 8 / 16 / 32 packs
    assert [chunk_num_splits(p, 8, 40960) for p in (8, 16, 32)] == [4, 2, 1]
    assert choose_num_splits(1, 8, 256) == 4  # no split shorter than one tile (64 keys)
