"""Paged decode attention over any mix of hot and cold (int8 / int4) blocks in one pass.

The layout the cold-prefix kernel does not take (a run-time switch between int8 and
int4 left both kinds in one sequence, or a block that could not be quantized for lack
of memory). Each table entry also carries its kind and slot; for every tile of keys the
kernel issues one masked load per kind (common.load_tile), so memory is read only for
the kind a block really has: an int8 block costs half the bytes of a hot one, an int4
block a quarter. A tile wholly in int8 blocks takes one unmasked-by-kind load instead
(on the H200 at 32k x 8 of int8: 341 us against 519 us with the per-kind loads alone,
2026-11-29). Splits merge in the kernel, as in common.finish_split.
"""
from __future__ import annotations

import torch

from ..availability import has_triton
from .common import TILE_TOKENS, check_num_splits, group_pad, split_buffers, split_counters, split_strides

# 2 warps without pipelining: the fastest of 2/4 warps x 1/2 stages on the H200 at 32k x 8 of int8
# (2026-11-29: 341 us; 2 stages 419 us, 4 warps 538 us).
NUM_WARPS, NUM_STAGES = 2, 1

if has_triton():
    import triton
    import triton.language as tl

    from .common import finish_split, group_queries, load_tile, online_softmax, split_bounds, splits_with_keys

    @triton.jit
    def _load_mixed(hot_ptr, i8_ptr, s8_ptr, i4_ptr, s4_ptr, hot_base, base8, scale_base8, base4, scale_base4,
                    kind, in_range, d, d2, HAS_INT8: tl.constexpr, HAS_INT4: tl.constexpr, ALL_INT8: tl.constexpr,
                    HEAD_DIM: tl.constexpr, GROUP4: tl.constexpr, DTYPE: tl.constexpr):
        """Keys (or values) of one tile and their per-token scales (load_tile), each token
        from the storage its kind names; with ALL_INT8 every token is int8."""
        if ALL_INT8:
            x, token_scale = load_tile(i8_ptr, s8_ptr, base8, scale_base8, in_range, d, d2, 1, HEAD_DIM, HEAD_DIM,
                                       DTYPE)
        else:
            hot = in_range & (kind == 0)
            x, token_scale = load_tile(hot_ptr, hot_ptr, hot_base, hot_base, hot, d, d2, 0, HEAD_DIM, HEAD_DIM, DTYPE)
            if HAS_INT8:
                m8 = in_range & (kind == 1)
                x8, s8 = load_tile(i8_ptr, s8_ptr, base8, scale_base8, m8, d, d2, 1, HEAD_DIM, HEAD_DIM, DTYPE)
                x = tl.where(m8[:, None], x8, x)
                token_scale = tl.where(m8, s8, token_scale)
            if HAS_INT4:
                m4 = in_range & (kind == 2)
                x4, s4 = load_tile(i4_ptr, s4_ptr, base4, scale_base4, m4, d, d2, 2, HEAD_DIM, GROUP4, DTYPE)
                x = tl.where(m4[:, None], x4, x)
                token_scale = tl.where(m4, s4, token_scale)
        return x, token_scale

    @triton.jit
    def _cold_decode_split_kernel(
        q_ptr, k_ptr, v_ptr, tables_ptr, kinds_ptr, slots_ptr, ctx_ptr, part_ptr, lse_ptr, out_ptr, done_ptr,
        k8_ptr, v8_ptr, ks8_ptr, vs8_ptr, k4_ptr, v4_ptr, ks4_ptr, vs4_ptr,
        scale, window,
        stride_qb, stride_qh,
        stride_hb, stride_ht, stride_hh,
        stride_tb,
        stride_8p, stride_8s, stride_8t, stride_8h, stride_s8p, stride_s8s, stride_s8h,
        stride_4p, stride_4s, stride_4t, stride_4h, stride_s4p, stride_s4s, stride_s4t, stride_s4h,
        stride_pb, stride_ph, stride_ps,
        stride_lb, stride_lh,
        stride_ob, stride_oh,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr,
        HAS_INT8: tl.constexpr, HAS_INT4: tl.constexpr, GROUP4: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        ctx, lo, hi = split_bounds(ctx_ptr, b, split, window, NUM_SPLITS, TILE)
        q, heads, is_head, d = group_queries(q_ptr, b, kvh, stride_qb, stride_qh, GROUP, GROUP_PAD, HEAD_DIM)
        d2 = tl.arange(0, HEAD_DIM // 2)
        dtype = q_ptr.dtype.element_ty
        m_i = tl.full([GROUP_PAD], -1e30, tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        for start in range(lo, hi, TILE):
            t = start + tl.arange(0, TILE)
            in_range = t < hi
            entry = b * stride_tb + t // BLOCK_SIZE
            page = tl.load(tables_ptr + entry, mask=in_range, other=0)
            kind = tl.load(kinds_ptr + entry, mask=in_range, other=0)
            slot = tl.load(slots_ptr + entry, mask=in_range, other=0)
            tok = t % BLOCK_SIZE
            page = page.to(tl.int64)
            hot_base = page * stride_hb + tok * stride_ht + kvh * stride_hh
            base8 = page * stride_8p + slot * stride_8s + tok * stride_8t + kvh * stride_8h
            scale_base8 = page * stride_s8p + slot * stride_s8s + kvh * stride_s8h
            base4 = page * stride_4p + slot * stride_4s + tok * stride_4t + kvh * stride_4h
            scale_base4 = page * stride_s4p + slot * stride_s4s + tok * stride_s4t + kvh * stride_s4h
            all_int8 = False
            if HAS_INT8:
                all_int8 = tl.min(tl.where(in_range, kind, 1)) == 1
            if all_int8:
                k, k_scale = _load_mixed(k_ptr, k8_ptr, ks8_ptr, k4_ptr, ks4_ptr, hot_base, base8, scale_base8, base4,
                                         scale_base4, kind, in_range, d, d2, HAS_INT8, HAS_INT4, True, HEAD_DIM,
                                         GROUP4, dtype)
            else:
                k, k_scale = _load_mixed(k_ptr, k8_ptr, ks8_ptr, k4_ptr, ks4_ptr, hot_base, base8, scale_base8, base4,
                                         scale_base4, kind, in_range, d, d2, HAS_INT8, HAS_INT4, False, HEAD_DIM,
                                         GROUP4, dtype)
            s = tl.where(in_range[None, :], tl.dot(q, tl.trans(k)) * (k_scale[None, :] * scale), float("-inf"))
            if all_int8:
                v, v_scale = _load_mixed(v_ptr, v8_ptr, vs8_ptr, v4_ptr, vs4_ptr, hot_base, base8, scale_base8, base4,
                                         scale_base4, kind, in_range, d, d2, HAS_INT8, HAS_INT4, True, HEAD_DIM,
                                         GROUP4, dtype)
            else:
                v, v_scale = _load_mixed(v_ptr, v8_ptr, vs8_ptr, v4_ptr, vs4_ptr, hot_base, base8, scale_base8, base4,
                                         scale_base4, kind, in_range, d, d2, HAS_INT8, HAS_INT4, False, HEAD_DIM,
                                         GROUP4, dtype)
            m_i, l_i, acc = online_softmax(s, v, v_scale, m_i, l_i, acc)
        used = splits_with_keys(ctx, window, NUM_SPLITS, TILE)
        finish_split(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, done_ptr, b, kvh, heads, is_head, d, split, used,
                     stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                     GROUP, HEAD_DIM, NUM_SPLITS)


def cold_paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cold,
                                block_tables: torch.Tensor, block_kinds: torch.Tensor, block_slots: torch.Tensor,
                                context_lens: torch.Tensor, scale: float, num_splits: int,
                                sliding_window: int | None = None, num_warps: int = NUM_WARPS,
                                num_stages: int = NUM_STAGES) -> torch.Tensor:
    """One query token per sequence; `cold` is a kv_cache.ColdLayer. Tables, kinds and
    slots are [B, max_blocks] with the same layout (kinds: 0 hot, 1 int8, 2 int4)."""
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    check_num_splits(num_splits)
    tables = block_tables.contiguous()
    kinds = block_kinds.to(tables.dtype).contiguous()
    slots = block_slots.to(tables.dtype).contiguous()
    has8, has4 = cold.scales8_k is not None, cold.scales4_k is not None
    # Kinds not allocated get harmless stand-ins: their loads are compiled out.
    i8k, i8v = cold.int8_k, cold.int8_v
    s8k = cold.scales8_k if has8 else k_cache
    s8v = cold.scales8_v if has8 else v_cache
    i4k, i4v = cold.int4_k, cold.int4_v
    s4k = cold.scales4_k if has4 else k_cache
    s4v = cold.scales4_v if has4 else v_cache
    group4 = head_dim // cold.scales4_k.shape[-1] if has4 else head_dim
    s8 = (s8k.stride(0), s8k.stride(1), s8k.stride(2)) if has8 else (0, 0, 0)
    s4 = (s4k.stride(0), s4k.stride(1), s4k.stride(2), s4k.stride(3)) if has4 else (0, 0, 0, 0)
    out, part, lse = split_buffers(q, num_splits)
    _cold_decode_split_kernel[(batch, kv_heads, num_splits)](
        q, k_cache, v_cache, tables, kinds, slots, context_lens, part, lse, out,
        split_counters(q.device, batch * kv_heads),
        i8k, i8v, s8k, s8v, i4k, i4v, s4k, s4v,
        scale, sliding_window or 0,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        tables.stride(0),
        i8k.stride(0), i8k.stride(1), i8k.stride(2), i8k.stride(3), *s8,
        i4k.stride(0), i4k.stride(1), i4k.stride(2), i4k.stride(3), *s4,
        *split_strides(q, part, lse, out, num_splits),
        GROUP=heads // kv_heads, GROUP_PAD=group_pad(heads, kv_heads), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, TILE=TILE_TOKENS, NUM_SPLITS=num_splits,
        HAS_INT8=has8, HAS_INT4=has4, GROUP4=group4, num_warps=num_warps, num_stages=num_stages,
    )
    return out
