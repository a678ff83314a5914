"""Paged decode attention for the usual cold layout: cold blocks first, then hot ones.

Each sequence's context is two runs (cold_layout.py): its leading `cold_blocks[b]`
blocks are all of one cold kind (int8, or int4 packed two per byte), the rest are hot.
A split loops over its share of the cold run and then over its share of the hot run
(common.hot_run, as in the hot kernel). Each loop has one kind of load and no decision
per tile, so Triton can pipeline it like the hot kernel, and an int8 tile costs half the
bytes of a hot one (int4: a quarter). The integer codes go into the dot products as they
are and each token's scale multiplies its scores (keys) or probabilities (values);
int4 with several scale groups per head is scaled per element.

The cold loop with bf16/fp16 queries (int8, and int4 with one scale per head) is shaped
by what the H200 showed: each tile's table entries and scales are read two tiles ahead,
so no iteration waits on a table read and then on the copies it addresses; scores in
base 2 with a bare ex2 and unmasked K/V loads cut instructions; the codes enter the dots
as codes.py describes; the probabilities' row sums wait until after the loop. float32
queries (the CPU interpreter's reference) and int4 with several scale groups per head
take the exact loop: codes converted to q's dtype, scores and probabilities scaled.
"""
from __future__ import annotations

import torch

from ..availability import has_triton
from .common import INT4, INT8, TILE_TOKENS, check_num_splits, group_pad, split_buffers, split_counters, split_strides

# Launch shape: 2 warps, 3 stages, 64-key tiles. On the H200 at 32k x 8 (one layer, 2026-11-29) it was the
# fastest of 2/4 warps x 1-3 stages x 64/128-key tiles for both kinds: int8 150 us (next 4 warps, 3 stages,
# 128 keys: 167 us), int4 184 us (next 207 us).
NUM_WARPS, NUM_STAGES = 2, 3
MIN_TILE = 32

if has_triton():
    import triton
    import triton.language as tl

    from .codes import int4_to_fp16, int4_values_to_fp16, int8_values_to_fp16, quantize_rows_int8
    from .common import (
        finish_split,
        group_queries,
        hot_run,
        load_codes,
        load_tile,
        online_softmax,
        split_bounds,
        splits_with_keys,
    )

    _LOG2E = tl.constexpr(1.4426950408889634)
    _LN2 = tl.constexpr(0.6931471805599453)

    @triton.jit
    def cold_entries(tables_ptr, slots_ptr, b, t, end, stride_tb, BLOCK_SIZE: tl.constexpr):
        """(page, slot) of the blocks holding tokens `t` (zeros past `end`)."""
        entry = b * stride_tb + t // BLOCK_SIZE
        page = tl.load(tables_ptr + entry, mask=t < end, other=0).to(tl.int64)
        slot = tl.load(slots_ptr + entry, mask=t < end, other=0)
        return page, slot

    @triton.jit
    def _cold_scales(cks_ptr, cvs_ptr, page, slot, t, kvh, stride_sp, stride_ss, stride_st, stride_sh,
                     BLOCK_SIZE: tl.constexpr):
        """Key and value scales (float32) of tokens `t`, whose blocks are at (page, slot)."""
        scale_base = page * stride_sp + slot * stride_ss + (t % BLOCK_SIZE) * stride_st + kvh * stride_sh
        return tl.load(cks_ptr + scale_base).to(tl.float32), tl.load(cvs_ptr + scale_base).to(tl.float32)

    @triton.jit
    def _recomputed(x):
        """x (table entries or scales, all >= 0; NaN kept) computed again rather than passed
        on: Triton's pipeliner leaves a loop alone when a loop-carried value is passed on
        unchanged (a dependence two iterations deep)."""
        return tl.maximum(x, 0, propagate_nan=tl.PropagateNan.ALL)

    @triton.jit
    def _entries_ahead(tables_ptr, slots_ptr, b, t, end, page_c, slot_c, page_n, slot_n, stride_tb,
                       BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr):
        """Table entries read two tiles ahead of their tile. Triton's pipeliner issues a
        tile's K/V copies num_stages - 1 iterations early; with the entries loaded in that
        same iteration, every copy waits on a dependent global read (table, then data).
        Returns this tile's (page, slot), then the next tile's and the one after it."""
        page_a, slot_a = cold_entries(tables_ptr, slots_ptr, b, t + 2 * TILE, end, stride_tb, BLOCK_SIZE)
        return page_c, slot_c, _recomputed(page_n), _recomputed(slot_n), page_a, slot_a

    @triton.jit
    def _cold_run_fast(q, ck_ptr, cv_ptr, cks_ptr, cvs_ptr, tables_ptr, slots_ptr, b, kvh, lo, hi, scale, d, d2,
                       stride_tb, stride_cp, stride_cs, stride_ct, stride_ch, stride_sp, stride_ss, stride_st, stride_sh,
                       GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                       TILE: tl.constexpr, KIND: tl.constexpr, PTX: tl.constexpr):
        """The softmax state (base e) over cold keys lo..hi: int8 keys by an int8 dot with
        int8 queries, int4 keys and all values as fp16 (codes.py)."""
        q16 = q.to(tl.float16)
        if KIND == 1:
            q8, q_scale = quantize_rows_int8(q)
            q_scale2 = q_scale * (scale * _LOG2E)
        m_i = tl.full([GROUP_PAD], -1e30, tl.float32)
        l_tile = tl.zeros([GROUP_PAD, TILE], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        # Scales are read ahead with the entries: pipelined, an int8 tile's 64 scale copies (one per
        # token, from one address per block) took 15 times the shared-memory wavefronts of distinct
        # addresses (ncu), about 9 us of 155 at 32k x 8.
        t_c = lo + tl.arange(0, TILE)
        page_c, slot_c = cold_entries(tables_ptr, slots_ptr, b, t_c, hi, stride_tb, BLOCK_SIZE)
        page_n, slot_n = cold_entries(tables_ptr, slots_ptr, b, t_c + TILE, hi, stride_tb, BLOCK_SIZE)
        k_scale_c, v_scale_c = _cold_scales(cks_ptr, cvs_ptr, page_c, slot_c, t_c, kvh,
                                            stride_sp, stride_ss, stride_st, stride_sh, BLOCK_SIZE)
        k_scale_n, v_scale_n = _cold_scales(cks_ptr, cvs_ptr, page_n, slot_n, t_c + TILE, kvh,
                                            stride_sp, stride_ss, stride_st, stride_sh, BLOCK_SIZE)
        for start in range(lo, hi, TILE):
            t = start + tl.arange(0, TILE)
            in_range = t < hi
            page, slot, page_c, slot_c, page_n, slot_n = _entries_ahead(tables_ptr, slots_ptr, b, t, hi, page_c,
                                                                        slot_c, page_n, slot_n, stride_tb,
                                                                        BLOCK_SIZE, TILE)
            k_scale, v_scale_raw = k_scale_c, v_scale_c
            k_scale_a, v_scale_a = _cold_scales(cks_ptr, cvs_ptr, page_n, slot_n, t + 2 * TILE, kvh,
                                                stride_sp, stride_ss, stride_st, stride_sh, BLOCK_SIZE)
            k_scale_c, v_scale_c = _recomputed(k_scale_n), _recomputed(v_scale_n)
            k_scale_n, v_scale_n = k_scale_a, v_scale_a
            # Unmasked: tokens past the run read page 0's slot 0 (their table entries load as
            # zeros), real and finite codes whose scores are masked below and whose zero
            # probabilities cancel them (the masks cost ~150 instructions a tile, offline SASS).
            # Only a value scale there could be inf or nan, which a zero probability would not
            # cancel: it is selected after the load.
            base = page * stride_cp + slot * stride_cs + (t % BLOCK_SIZE) * stride_ct + kvh * stride_ch
            k = load_codes(ck_ptr, base, None, d, d2, KIND)
            v = load_codes(cv_ptr, base, None, d, d2, KIND)
            v_scale = tl.where(in_range, v_scale_raw, 1.0)
            # Scores in base 2, masked by adding -inf past the keys in the same fused
            # multiply-add that scales them.
            bias = tl.where(in_range, 0.0, float("-inf"))
            if KIND == 2:
                s = tl.dot(q16, tl.trans(int4_to_fp16(k)))
                s = tl.fma(s, (k_scale * (scale * _LOG2E))[None, :], bias[None, :])
                v16 = int4_values_to_fp16(v, PTX)
            else:
                s = tl.dot(q8, tl.trans(k), out_dtype=tl.int32).to(tl.float32)
                s = tl.fma(s * q_scale2[:, None], k_scale[None, :], bias[None, :])
                v16 = int8_values_to_fp16(v, PTX)
            m_i, l_tile, acc = online_softmax(s, v16, v_scale, m_i, l_tile, acc, True, PTX)
        return m_i * _LN2, tl.sum(l_tile, 1), acc

    @triton.jit
    def _cold_run_exact(q, ck_ptr, cv_ptr, cks_ptr, cvs_ptr, tables_ptr, slots_ptr, b, kvh, lo, hi, scale, d, d2,
                        stride_tb, stride_cp, stride_cs, stride_ct, stride_ch, stride_sp, stride_ss, stride_st,
                        stride_sh, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                        TILE: tl.constexpr, KIND: tl.constexpr, GROUP4: tl.constexpr):
        """The softmax state over cold keys lo..hi with the codes converted to q's dtype."""
        m_i = tl.full([GROUP_PAD], -1e30, tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        t_c = lo + tl.arange(0, TILE)
        page_c, slot_c = cold_entries(tables_ptr, slots_ptr, b, t_c, hi, stride_tb, BLOCK_SIZE)
        page_n, slot_n = cold_entries(tables_ptr, slots_ptr, b, t_c + TILE, hi, stride_tb, BLOCK_SIZE)
        for start in range(lo, hi, TILE):
            t = start + tl.arange(0, TILE)
            in_range = t < hi
            tok = t % BLOCK_SIZE
            page, slot, page_c, slot_c, page_n, slot_n = _entries_ahead(tables_ptr, slots_ptr, b, t, hi, page_c,
                                                                        slot_c, page_n, slot_n, stride_tb,
                                                                        BLOCK_SIZE, TILE)
            base = page * stride_cp + slot * stride_cs + tok * stride_ct + kvh * stride_ch
            scale_base = page * stride_sp + slot * stride_ss + tok * stride_st + kvh * stride_sh
            k, k_scale = load_tile(ck_ptr, cks_ptr, base, scale_base, in_range, d, d2, KIND, HEAD_DIM, GROUP4, q.dtype)
            v, v_scale = load_tile(cv_ptr, cvs_ptr, base, scale_base, in_range, d, d2, KIND, HEAD_DIM, GROUP4, q.dtype)
            s = tl.where(in_range[None, :], tl.dot(q, tl.trans(k)) * (k_scale[None, :] * scale), float("-inf"))
            m_i, l_i, acc = online_softmax(s, v, v_scale, m_i, l_i, acc)
        return m_i, l_i, acc

    @triton.jit
    def _cold_prefix_split_kernel(
        q_ptr, k_ptr, v_ptr, tables_ptr, slots_ptr, cold_blocks_ptr, ctx_ptr, part_ptr, lse_ptr, out_ptr, done_ptr,
        ck_ptr, cv_ptr, cks_ptr, cvs_ptr,
        scale, window,
        stride_qb, stride_qh,
        stride_hb, stride_ht, stride_hh,
        stride_tb,
        stride_cp, stride_cs, stride_ct, stride_ch,
        stride_sp, stride_ss, stride_st, stride_sh,
        stride_pb, stride_ph, stride_ps,
        stride_lb, stride_lh,
        stride_ob, stride_oh,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr,
        KIND: tl.constexpr, GROUP4: tl.constexpr, PTX: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        ctx, lo, hi = split_bounds(ctx_ptr, b, split, window, NUM_SPLITS, TILE)
        cold_end = tl.minimum(tl.load(cold_blocks_ptr + b).to(tl.int32) * BLOCK_SIZE, ctx)
        cold_hi = tl.minimum(hi, cold_end)
        q, heads, is_head, d = group_queries(q_ptr, b, kvh, stride_qb, stride_qh, GROUP, GROUP_PAD, HEAD_DIM)
        d2 = tl.arange(0, HEAD_DIM // 2)
        FAST: tl.constexpr = q_ptr.dtype.element_ty != tl.float32 and (KIND == 1 or GROUP4 == HEAD_DIM)
        if FAST:
            m_i, l_i, acc = _cold_run_fast(q, ck_ptr, cv_ptr, cks_ptr, cvs_ptr, tables_ptr, slots_ptr, b, kvh, lo,
                                           cold_hi, scale, d, d2, stride_tb, stride_cp, stride_cs, stride_ct,
                                           stride_ch, stride_sp, stride_ss, stride_st, stride_sh,
                                           GROUP_PAD, HEAD_DIM, BLOCK_SIZE, TILE, KIND, PTX)
        else:
            m_i, l_i, acc = _cold_run_exact(q, ck_ptr, cv_ptr, cks_ptr, cvs_ptr, tables_ptr, slots_ptr, b, kvh, lo,
                                            cold_hi, scale, d, d2, stride_tb, stride_cp, stride_cs, stride_ct,
                                            stride_ch, stride_sp, stride_ss, stride_st, stride_sh,
                                            GROUP_PAD, HEAD_DIM, BLOCK_SIZE, TILE, KIND, GROUP4)
        # q read again for the hot loop: its shared-memory copy for the dot would otherwise be
        # live through the cold loop, and those 4 KB decide whether four programs fit an SM.
        q, heads, is_head, d = group_queries(q_ptr, b, kvh, stride_qb, stride_qh, GROUP, GROUP_PAD, HEAD_DIM)
        m_i, l_i, acc = hot_run(q, k_ptr, v_ptr, tables_ptr, b, kvh, tl.maximum(lo, cold_end), hi, m_i, l_i, acc,
                                scale, d, stride_tb, stride_hb, stride_ht, stride_hh, BLOCK_SIZE, TILE)
        used = splits_with_keys(ctx, window, NUM_SPLITS, TILE)
        finish_split(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, done_ptr, b, kvh, heads, is_head, d, split, used,
                     stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                     GROUP, HEAD_DIM, NUM_SPLITS)


def cold_prefix_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cold,
                                 block_tables: torch.Tensor, block_slots: torch.Tensor, cold_blocks: torch.Tensor,
                                 kind: int, context_lens: torch.Tensor, scale: float, num_splits: int,
                                 sliding_window: int | None = None, num_warps: int = NUM_WARPS,
                                 num_stages: int = NUM_STAGES, tile: int = TILE_TOKENS) -> torch.Tensor:
    """One query token per sequence. Tables and slots are [B, max_blocks] (pages; the
    slot within the page for cold entries); `cold_blocks[b]` leading entries of row b
    are cold blocks of `kind` (1 int8, 2 int4), the rest hot; `cold` is the layer's
    kv_cache.ColdLayer. Returns [B, H, D] in q's dtype. Warps, stages and the tile are
    launch parameters (defaults: NUM_WARPS, NUM_STAGES, TILE_TOKENS)."""
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if kind not in (INT8, INT4):
        raise ValueError(f"kind must be {INT8} (int8) or {INT4} (int4), got {kind}")
    check_num_splits(num_splits)
    if tile < MIN_TILE or tile & (tile - 1):
        # At 16, int4 gave wrong outputs on the H200 (Triton 3.6; relative error 1.6) while
        # the interpreter agrees with the portable path: a code-generation problem, not
        # investigated; 16 was also the slowest tile for int8.
        raise ValueError(f"tile must be a power of two of at least {MIN_TILE}, got {tile}")
    if block_slots.shape != block_tables.shape or block_slots.stride() != block_tables.stride():
        raise ValueError("block tables and slots must have the same shape and strides")
    if kind == INT8:
        data_k, data_v, scales_k, scales_v = cold.int8_k, cold.int8_v, cold.scales8_k, cold.scales8_v
    else:
        data_k, data_v, scales_k, scales_v = cold.int4_k, cold.int4_v, cold.scales4_k, cold.scales4_v
    if scales_k is None:
        raise ValueError(f"the KV cache has no {'int8' if kind == INT8 else 'int4'} blocks enabled")
    if kind == INT8:  # one scale per block and head: no token stride
        scale_strides = (scales_k.stride(0), scales_k.stride(1), 0, scales_k.stride(2))
        group4 = head_dim
    else:
        scale_strides = (scales_k.stride(0), scales_k.stride(1), scales_k.stride(2), scales_k.stride(3))
        group4 = head_dim // scales_k.shape[-1]
    out, part, lse = split_buffers(q, num_splits)
    _cold_prefix_split_kernel[(batch, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, block_slots, cold_blocks, context_lens, part, lse, out,
        split_counters(q.device, batch * kv_heads), data_k, data_v, scales_k, scales_v,
        scale, sliding_window or 0,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        data_k.stride(0), data_k.stride(1), data_k.stride(2), data_k.stride(3),
        *scale_strides,
        *split_strides(q, part, lse, out, num_splits),
        GROUP=heads // kv_heads, GROUP_PAD=group_pad(heads, kv_heads), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, TILE=tile, NUM_SPLITS=num_splits, KIND=kind, GROUP4=group4,
        PTX=q.is_cuda and torch.version.hip is None, num_warps=num_warps, num_stages=num_stages,
    )
    return out
