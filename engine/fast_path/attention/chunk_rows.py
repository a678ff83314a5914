"""Paged attention for a prefill chunk run as rows of the decode graphs (cuda_graphs.py),
with the rows of one sequence in packs that share their K/V reads.

A chunk of n new tokens becomes n rows, row i attending to the keys up to its own
position. Through the decode kernel (hot.py) each row reads the sequence's whole
context on its own: 32 new tokens after a 2,048-token prefix read its K/V 32 times.
Here `rows_per_pack` consecutive rows of one sequence are one program's query block:
the pack's rows times the GQA group are the rows of its dot products (4 rows of GQA 4
fill the 16 rows the decode kernel pads a group of 4 to anyway), its keys are read
once, and a per-row mask keeps each row causal. The host lays the rows out so that a
pack never spans two sequences: every sequence's rows start a pack, and a short last
pack is padded with rows of context 0 (zeros out). Any number of rows launches: the
last pack may run past the batch (a lone 6-token chunk in packs of 16 is a graph of 8
rows), its missing rows masked in the kernel. The splits and their in-kernel merge are
those of common.py, with the pack's rows and heads as the merge's heads.
"""

from __future__ import annotations

import torch

from ..availability import has_triton
from ..launch_shape import cdiv, next_power_of_2
from .common import MERGE_TILE_ELEMENTS, TILE_TOKENS, check_num_splits, choose_num_splits, split_counters

if has_triton():
    import triton
    import triton.language as tl

    from .common import finish_split, head_lanes, hot_run, lane_mask

    @triton.jit
    def _chunk_split_kernel(
        q_ptr, k_ptr, v_ptr, tables_ptr, ctx_ptr, part_ptr, lse_ptr, out_ptr, done_ptr,
        scale, num_rows,
        stride_qb, stride_qh,
        stride_kb, stride_kt, stride_kh,
        stride_tb,
        stride_pb, stride_ph, stride_ps,
        stride_lb, stride_lh,
        stride_ob, stride_oh,
        ROWS: tl.constexpr, GROUP: tl.constexpr, PACK_HEADS: tl.constexpr, PACK_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr,
        MERGE_TILE: tl.constexpr, PREFETCH: tl.constexpr,
    ):
        pack = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        i = tl.arange(0, PACK_PAD)  # query i: row i // GROUP of the pack, head kvh * GROUP + i % GROUP
        row = pack * ROWS + i // GROUP
        is_query = (i < PACK_HEADS) & (row < num_rows)
        row_ctx = tl.load(ctx_ptr + row, mask=is_query, other=0).to(tl.int32)
        ctx = tl.max(row_ctx, 0)  # the pack's last real row sees the most keys
        per_split = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), TILE) * TILE
        lo = split * per_split
        hi = tl.minimum(lo + per_split, ctx)
        used = tl.maximum(tl.cdiv(ctx, tl.maximum(per_split, 1)), 1)
        if split < used:
            d = head_lanes(HEAD_DIM)
            q = tl.load(q_ptr + row[:, None] * stride_qb + (kvh * GROUP + i % GROUP)[:, None] * stride_qh + d[None, :],
                        mask=lane_mask(is_query, d, HEAD_DIM), other=0.0)
            m_i = tl.full([PACK_PAD], -1e30, tl.float32)
            l_i = tl.zeros([PACK_PAD], tl.float32)
            acc = tl.zeros([PACK_PAD, triton.next_power_of_2(HEAD_DIM)], tl.float32)
            m_i, l_i, acc = hot_run(q, k_ptr, v_ptr, tables_ptr, pack, kvh, lo, hi, m_i, l_i, acc, scale, d,
                                    stride_tb, stride_kb, stride_kt, stride_kh, BLOCK_SIZE, TILE, row_ctx,
                                    PREFETCH, HEAD_DIM)
            # The pack's queries are the merge's heads: pack-major buffers, permuted back by the caller.
            heads = kvh * PACK_HEADS + i
            finish_split(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, done_ptr, pack, kvh, heads, is_query, d, split,
                         used, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                         PACK_HEADS, HEAD_DIM, NUM_SPLITS, MERGE_TILE)


# Two stages of K/V loads in flight, not Triton's default three: on the H200, 32 to 128
# rows after a 2,080-token prefix took 7-10 % less time per layer (28.3 against 31.3 us
# at 32 rows, 66.6 against 71.9 at 128, in CUDA-graph replays: bench/attention_sweep.py).
CHUNK_STAGES = 2

# Block-table entries a tile ahead (common.hot_run): on the H200, after a 2,080-token
# prefix, 32 rows in packs of 4 took 22.7 against 23.8 us a layer, 64 and 128 rows in
# packs of 16 25.2 and 29.9 against 28.4 and 35.7 (bench/attention_sweep.py --prefetch 0,1).
CHUNK_PREFETCH = True

# One wave's worth of programs (packs x KV heads x splits up to the H200's 132 SMs), not
# the decode kernel's two: on the H200, 32 / 64 / 128 rows after a 2,080-token prefix took
# 23.4 / 35.5 / 56.7 us a layer with half the splits that two waves' worth gave, against
# 27.6 / 39.4 / 68.5 (bench/attention_sweep.py). Packs of 16 rows instead of 4 were slower
# at every split count (37.7 / 43.6 / 62.7 at best).
CHUNK_TARGET_PROGRAMS = 132


def chunk_num_splits(packs: int, num_kv_heads: int, max_context_len: int) -> int:
    """The split count for a chunk-row launch of `packs` packs."""
    return choose_num_splits(packs, num_kv_heads, max_context_len, CHUNK_TARGET_PROGRAMS)


# Queries (rows x GQA group) of a large pack, for the larger chunk graphs
# (cuda_graphs.LARGE_PACK_MIN_ROWS): on the H200, 64 / 128 rows after a 2,080-token prefix
# took 28.3 / 34.7 us a layer in packs of 16 rows (64 queries), against 36.5 / 62.4 in
# packs of 4; at 32 rows packs of 4 stay ahead, 23.5 against 25.0 us
# (bench/attention_sweep.py --pack-rows 4,16).
LARGE_PACK_QUERIES = 64


def rows_per_pack(num_heads: int, num_kv_heads: int, queries: int = 16) -> int:
    """Rows a pack takes: as many as fill `queries` query rows with the GQA group (a
    power of two, at least 1, at most 16). With 16 queries: 4 for GQA 4, 2 for GQA 6-8,
    16 without GQA; with 64: 16 for GQA 4, 8 for GQA 6-8."""
    group = num_heads // num_kv_heads
    rows = min(16, max(1, queries // group))
    return 1 << (rows.bit_length() - 1)


def large_pack_queries(head_dim: int) -> int:
    """Queries of a large pack at this head dim: LARGE_PACK_QUERIES, or fewer where one
    split of each of them would not fit a round of the split merge (a head dim above 128;
    padded head dims count whole): a power of two, so that a pack's queries padded to one
    never outgrow the round either."""
    fitting = min(LARGE_PACK_QUERIES, MERGE_TILE_ELEMENTS // next_power_of_2(head_dim))
    return 1 << (max(1, fitting).bit_length() - 1)


def paged_chunk_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                          num_splits: int, rows_per_pack: int, num_warps: int = 4,
                          num_stages: int = CHUNK_STAGES, tile_tokens: int = TILE_TOKENS,
                          merge_tile: int = MERGE_TILE_ELEMENTS, prefetch: bool = CHUNK_PREFETCH) -> torch.Tensor:
    """q: [B, H, D], any B; rows p * R .. p * R + R - 1 share the block table of row p * R
    (rows of context 0 are padding, zeros out; a last pack past B is cut short). Each row attends
    to its first context_lens[row] keys, `tile_tokens` keys per iteration; the last split
    of a pack merges `merge_tile` float32 partial-output elements a round; `prefetch`: each
    tile's block-table entries are loaded one tile ahead (common.hot_run). Returns [B, H, D]
    in q's dtype."""
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, cache_dim = k_cache.shape
    if cache_dim != head_dim or heads % kv_heads:
        raise ValueError(f"q {tuple(q.shape)} does not fit the KV cache {tuple(k_cache.shape)}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("K and V caches must share strides with a contiguous head dimension")
    rows = rows_per_pack
    if rows < 1 or rows & (rows - 1):
        raise ValueError(f"rows_per_pack must be a power of two, got {rows}")
    check_num_splits(num_splits)
    if tile_tokens < 16 or tile_tokens & (tile_tokens - 1):
        raise ValueError(f"tile_tokens must be a power of two of at least 16, got {tile_tokens}")
    group = heads // kv_heads
    packs, pack_heads = cdiv(batch, rows), rows * group
    merge_round = next_power_of_2(pack_heads) * next_power_of_2(head_dim)
    if merge_tile < merge_round or merge_tile & (merge_tile - 1):
        raise ValueError(f"merge_tile must be a power of two of at least {merge_round} (one split of a pack's "
                         f"{pack_heads} queries), got {merge_tile}")
    # Buffers in pack-major order: [packs, kv_heads * pack_heads, D], query (row r, head g
    # of KV head h) at kv head-major position h * pack_heads + r * group + g.
    out = torch.empty(packs, kv_heads * pack_heads, head_dim, dtype=q.dtype, device=q.device)
    if num_splits == 1:
        part, lse = out, out
        part_strides = (out.stride(0), out.stride(1), 0)
    else:
        part = torch.empty(packs, kv_heads * pack_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(packs, kv_heads * pack_heads, num_splits, dtype=torch.float32, device=q.device)
        part_strides = (part.stride(0), part.stride(1), part.stride(2))
    _chunk_split_kernel[(packs, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, part, lse, out, split_counters(q.device, packs * kv_heads),
        scale, batch,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0) * rows,  # a pack reads its first row's table
        *part_strides,
        lse.stride(0), lse.stride(1), out.stride(0), out.stride(1),
        ROWS=rows, GROUP=group, PACK_HEADS=pack_heads, PACK_PAD=max(16, next_power_of_2(pack_heads)),
        HEAD_DIM=head_dim, BLOCK_SIZE=block_size, TILE=tile_tokens, NUM_SPLITS=num_splits, MERGE_TILE=merge_tile,
        PREFETCH=prefetch,
        num_warps=num_warps, num_stages=num_stages,
    )
    # [packs, kv_heads, rows, group, D] -> [packs, rows, kv_heads, group, D] -> [B, H, D]
    by_row = out.view(packs, kv_heads, rows, group, head_dim).transpose(1, 2).reshape(packs * rows, heads, head_dim)
    return by_row[:batch]
