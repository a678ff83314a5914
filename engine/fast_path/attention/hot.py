"""Paged decode attention over hot (bf16/fp16) blocks: the scheme of common.py with
programmatic dependent launch (pdl.py), bf16/fp16 in, fp32 softmax and accumulation."""
from __future__ import annotations

import torch

from ..availability import has_triton
from ..pdl import pdl_launch
from .common import TILE_TOKENS, check_num_splits, group_pad, split_buffers, split_counters, split_strides

if has_triton():
    import triton
    import triton.language as tl

    from ..pdl import release_dependents, wait_for_previous
    from .common import finish_split, group_queries, hot_run, split_bounds, splits_with_keys

    @triton.jit
    def _decode_split_kernel(
        q_ptr, k_ptr, v_ptr, tables_ptr, ctx_ptr, part_ptr, lse_ptr, out_ptr, done_ptr,
        scale, window,
        stride_qb, stride_qh,
        stride_kb, stride_kt, stride_kh,
        stride_tb,
        stride_pb, stride_ph, stride_ps,
        stride_lb, stride_lh,
        stride_ob, stride_oh,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr, USE_PDL: tl.constexpr,
        EARLY_RELEASE: tl.constexpr, INPUTS_READY: tl.constexpr, PREFETCH: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        # INPUTS_READY: the context lengths were written before the previous kernel (a
        # decode step's inputs), so they are read before waiting for it (pdl.py); q, the
        # tables and the caches only after.
        if not INPUTS_READY:
            wait_for_previous(USE_PDL)
        ctx, lo, hi = split_bounds(ctx_ptr, b, split, window, NUM_SPLITS, TILE)
        used = splits_with_keys(ctx, window, NUM_SPLITS, TILE)
        if split < used:  # splits past the keys do nothing, and the merge reads only those with keys
            if INPUTS_READY:
                wait_for_previous(USE_PDL)
            q, heads, is_head, d = group_queries(q_ptr, b, kvh, stride_qb, stride_qh, GROUP, GROUP_PAD, HEAD_DIM)
            m_i = tl.full([GROUP_PAD], -1e30, tl.float32)
            l_i = tl.zeros([GROUP_PAD], tl.float32)
            acc = tl.zeros([GROUP_PAD, triton.next_power_of_2(HEAD_DIM)], tl.float32)
            m_i, l_i, acc = hot_run(q, k_ptr, v_ptr, tables_ptr, b, kvh, lo, hi, m_i, l_i, acc, scale, d,
                                    stride_tb, stride_kb, stride_kt, stride_kh, BLOCK_SIZE, TILE, None, PREFETCH,
                                    HEAD_DIM)
            release_dependents(USE_PDL, EARLY_RELEASE)
            finish_split(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, done_ptr, b, kvh, heads, is_head, d, split, used,
                         stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                         GROUP, HEAD_DIM, NUM_SPLITS)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           num_splits: int, sliding_window: int | None = None,
                           inputs_ready: bool = False, num_warps: int = 4, num_stages: int = 3,
                           prefetch: bool = False) -> torch.Tensor:
    """One query token per sequence. q: [B, H, D] (last dim contiguous); caches
    [num_blocks, block_size, kv_heads, D]; returns [B, H, D] in q's dtype.
    `inputs_ready`: context_lens and block_tables were written before the kernel
    launched just before this one (a decode step's inputs, copied in before its first
    kernel), so with PDL the kernel may read them before waiting for that kernel.
    num_warps, num_stages: the launch shape. Triton's defaults: on the H200 they were
    within 4 % of the best of bench/attention_sweep.py's shapes at 32-256 rows; at 8
    rows and context 640, 2 warps took 9.9 against 11.6 us (54 us of a 4.6 ms step).
    `prefetch`: block-table entries a tile ahead (common.hot_run); off in the engine: on
    the H200 it was slower at 64-256 rows (context 640, 64 rows: 51.8 against 43.4 us)."""
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, cache_dim = k_cache.shape
    if cache_dim != head_dim or heads % kv_heads:
        raise ValueError(f"q {tuple(q.shape)} does not fit the KV cache {tuple(k_cache.shape)}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("K and V caches must share strides with a contiguous head dimension")
    check_num_splits(num_splits)
    out, part, lse = split_buffers(q, num_splits)
    _decode_split_kernel[(batch, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, part, lse, out, split_counters(q.device, batch * kv_heads),
        scale, sliding_window or 0,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        *split_strides(q, part, lse, out, num_splits),
        GROUP=heads // kv_heads, GROUP_PAD=group_pad(heads, kv_heads), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, TILE=TILE_TOKENS, NUM_SPLITS=num_splits, INPUTS_READY=inputs_ready,
        PREFETCH=prefetch,
        num_warps=num_warps, num_stages=num_stages, **pdl_launch(q.device, releases=True),
    )
    return out
