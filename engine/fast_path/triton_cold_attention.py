"""Paged decode attention over hot and cold (int8 / int4) blocks in one pass.

The same flash-decoding scheme as triton_attention.py (one program per sequence, KV
head and split; the whole GQA group per program; partial results merged by the same
merge kernel), but each table entry also carries its kind and slot. For every tile of
keys the kernel issues one masked load per kind (hot from the bf16/fp16 page, int8 or
packed int4 from the cold slot with its scales), so memory is read only for the kind a
block really has: an int8 block costs half the bytes of a hot one, an int4 block a
quarter. The integer codes go into the dot products as they are (exact in bf16/fp16)
and each token's scale multiplies its score (keys) or its probability (values), so
dequantization costs no per-element work; no full-precision copy is written.
"""
from __future__ import annotations

import torch

from .availability import has_triton
from .triton_attention import TILE_TOKENS, merge_splits, split_buffers

if has_triton():
    import triton
    import triton.language as tl

    from .triton_attention import _group_queries, _split_bounds, _store_split

    @triton.jit
    def _load_mixed(hot_ptr, i8_ptr, s8_ptr, i4_ptr, s4_ptr, page, slot, tok, kvh, kind, in_range, d, d2,
                    stride_hb, stride_ht, stride_hh,
                    stride_8p, stride_8s, stride_8t, stride_8h, stride_s8p, stride_s8s, stride_s8h,
                    stride_4p, stride_4s, stride_4t, stride_4h, stride_s4p, stride_s4s, stride_s4t, stride_s4h,
                    HAS_INT8: tl.constexpr, HAS_INT4: tl.constexpr, HEAD_DIM: tl.constexpr, GROUP4: tl.constexpr,
                    DTYPE: tl.constexpr):
        """Keys (or values) of one tile in DTYPE, not yet scaled, and a per-token scale
        ([TILE], 1 for hot tokens) to apply to the scores (keys) or probabilities (values):
        the integer codes are exact in bf16/fp16, so the dot product runs on them directly
        and no per-element multiply is needed. int4 groups smaller than the head dimension
        are scaled per element instead (token scale 1)."""
        hot = in_range & (kind == 0)
        offs = page.to(tl.int64) * stride_hb + tok * stride_ht + kvh * stride_hh
        x = tl.load(hot_ptr + offs[:, None] + d[None, :], mask=hot[:, None], other=0.0).to(DTYPE)
        token_scale = tl.full(kind.shape, 1.0, tl.float32)
        if HAS_INT8:
            m8 = in_range & (kind == 1)
            o8 = page.to(tl.int64) * stride_8p + slot * stride_8s + tok * stride_8t + kvh * stride_8h
            q8 = tl.load(i8_ptr + o8[:, None] + d[None, :], mask=m8[:, None], other=0)
            x = tl.where(m8[:, None], q8.to(DTYPE), x)
            s8 = tl.load(s8_ptr + page.to(tl.int64) * stride_s8p + slot * stride_s8s + kvh * stride_s8h,
                         mask=m8, other=1.0).to(tl.float32)
            token_scale = tl.where(m8, s8, token_scale)
        if HAS_INT4:
            m4 = in_range & (kind == 2)
            o4 = page.to(tl.int64) * stride_4p + slot * stride_4s + tok * stride_4t + kvh * stride_4h
            packed = tl.load(i4_ptr + o4[:, None] + d2[None, :], mask=m4[:, None], other=0x88).to(tl.int32)
            q4 = tl.interleave((packed & 0xF) - 8, (packed >> 4) - 8)  # even dims low nibble, odd high
            so = page.to(tl.int64) * stride_s4p + slot * stride_s4s + tok * stride_s4t + kvh * stride_s4h
            if GROUP4 == HEAD_DIM:
                x = tl.where(m4[:, None], q4.to(DTYPE), x)
                s4 = tl.load(s4_ptr + so, mask=m4, other=1.0).to(tl.float32)
                token_scale = tl.where(m4, s4, token_scale)
            else:
                s4 = tl.load(s4_ptr + so[:, None] + (d // GROUP4)[None, :], mask=m4[:, None], other=0.0)
                x = tl.where(m4[:, None], (q4.to(tl.float32) * s4.to(tl.float32)).to(DTYPE), x)
        return x, token_scale

    @triton.jit
    def _load_int8_only(i8_ptr, s8_ptr, page, slot, tok, kvh, in_range, d,
                        stride_8p, stride_8s, stride_8t, stride_8h, stride_s8p, stride_s8s, stride_s8h,
                        DTYPE: tl.constexpr):
        """The common case of a tile wholly in int8 blocks: one load, no merging."""
        o8 = page.to(tl.int64) * stride_8p + slot * stride_8s + tok * stride_8t + kvh * stride_8h
        x = tl.load(i8_ptr + o8[:, None] + d[None, :], mask=in_range[:, None], other=0).to(DTYPE)
        s8 = tl.load(s8_ptr + page.to(tl.int64) * stride_s8p + slot * stride_s8s + kvh * stride_s8h,
                     mask=in_range, other=1.0).to(tl.float32)
        return x, s8

    @triton.jit
    def _cold_decode_split_kernel(
        q_ptr, k_ptr, v_ptr, tables_ptr, kinds_ptr, slots_ptr, ctx_ptr, part_ptr, lse_ptr, out_ptr,
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
        HAS_INT8: tl.constexpr, HAS_INT4: tl.constexpr, GROUP4: tl.constexpr, UNIFORM_FAST: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        ctx, lo, hi = _split_bounds(ctx_ptr, b, split, window, NUM_SPLITS, TILE)
        q, heads, is_head, d = _group_queries(q_ptr, b, kvh, stride_qb, stride_qh, GROUP, GROUP_PAD, HEAD_DIM)
        d2 = tl.arange(0, HEAD_DIM // 2)

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
            all_int8 = False
            if HAS_INT8 and UNIFORM_FAST:
                all_int8 = tl.min(tl.where(in_range, kind, 1)) == 1
            if all_int8:
                k, k_scale = _load_int8_only(k8_ptr, ks8_ptr, page, slot, tok, kvh, in_range, d,
                                             stride_8p, stride_8s, stride_8t, stride_8h,
                                             stride_s8p, stride_s8s, stride_s8h, q_ptr.dtype.element_ty)
            else:
                k, k_scale = _load_mixed(
                    k_ptr, k8_ptr, ks8_ptr, k4_ptr, ks4_ptr, page, slot, tok, kvh, kind, in_range, d, d2,
                    stride_hb, stride_ht, stride_hh,
                    stride_8p, stride_8s, stride_8t, stride_8h, stride_s8p, stride_s8s, stride_s8h,
                    stride_4p, stride_4s, stride_4t, stride_4h, stride_s4p, stride_s4s, stride_s4t, stride_s4h,
                    HAS_INT8, HAS_INT4, HEAD_DIM, GROUP4, q_ptr.dtype.element_ty)
            s = tl.dot(q, tl.trans(k)) * (k_scale[None, :] * scale)
            s = tl.where(in_range[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            if all_int8:
                v, v_scale = _load_int8_only(v8_ptr, vs8_ptr, page, slot, tok, kvh, in_range, d,
                                             stride_8p, stride_8s, stride_8t, stride_8h,
                                             stride_s8p, stride_s8s, stride_s8h, q_ptr.dtype.element_ty)
            else:
                v, v_scale = _load_mixed(
                    v_ptr, v8_ptr, vs8_ptr, v4_ptr, vs4_ptr, page, slot, tok, kvh, kind, in_range, d, d2,
                    stride_hb, stride_ht, stride_hh,
                    stride_8p, stride_8s, stride_8t, stride_8h, stride_s8p, stride_s8s, stride_s8h,
                    stride_4p, stride_4s, stride_4t, stride_4h, stride_s4p, stride_s4s, stride_s4t, stride_s4h,
                    HAS_INT8, HAS_INT4, HEAD_DIM, GROUP4, q_ptr.dtype.element_ty)
            acc = acc * alpha[:, None] + tl.dot((p * v_scale[None, :]).to(v.dtype), v)
            m_i = m_new

        _store_split(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, b, heads, is_head, d, split,
                     stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh, NUM_SPLITS)


def cold_paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cold,
                                block_tables: torch.Tensor, block_kinds: torch.Tensor, block_slots: torch.Tensor,
                                context_lens: torch.Tensor, scale: float, num_splits: int,
                                sliding_window: int | None = None, num_warps: int = 2,
                                num_stages: int = 1, uniform_fast: bool = True) -> torch.Tensor:
    """One query token per sequence; `cold` is a kv_cache.ColdLayer. Tables, kinds and
    slots are [B, max_blocks] with the same layout (kinds: 0 hot, 1 int8, 2 int4).
    Launch defaults from a sweep on the H200 (BENCHMARKS.md): 2 warps, no pipelining."""
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if num_splits < 1 or num_splits & (num_splits - 1):
        raise ValueError(f"num_splits must be a power of two, got {num_splits}")
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
    group = heads // kv_heads
    out, part, lse = split_buffers(q, num_splits)
    _cold_decode_split_kernel[(batch, kv_heads, num_splits)](
        q, k_cache, v_cache, tables, kinds, slots, context_lens, part, lse, out,
        i8k, i8v, s8k, s8v, i4k, i4v, s4k, s4v,
        scale, sliding_window or 0,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        tables.stride(0),
        i8k.stride(0), i8k.stride(1), i8k.stride(2), i8k.stride(3), *s8,
        i4k.stride(0), i4k.stride(1), i4k.stride(2), i4k.stride(3), *s4,
        part.stride(0), part.stride(1), part.stride(2) if num_splits > 1 else 0,
        lse.stride(0), lse.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, TILE=TILE_TOKENS, NUM_SPLITS=num_splits,
        HAS_INT8=has8, HAS_INT4=has4, GROUP4=group4, UNIFORM_FAST=uniform_fast,
        num_warps=num_warps, num_stages=num_stages,
    )
    merge_splits(out, part, lse, num_splits)
    return out
