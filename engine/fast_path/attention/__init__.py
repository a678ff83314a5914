"""Decode and mixed-step attention on the fast path, and the one dispatcher over them.

- hot.py: decode rows over hot (bf16/fp16) blocks;
- cold_prefix.py: decode rows whose cold blocks lead their tables (the usual layout);
- mixed_cold.py: decode rows with any other mix of hot, int8 and int4 blocks;
- chunk_rows.py: a prefill chunk as rows of the decode graphs, packs of rows sharing K/V reads;
- prefill.py: prefill and mixed steps (decode rows through the kernels above, prefill
  rows through SDPA over the gathered context);
- common.py (and codes.py for the cold-prefix fast loop): the Triton helpers they share.

Importing this package defines the kernels: the engine imports it only when it attaches
the fast path, after a test has had the chance to choose Triton's interpreter.
"""

from __future__ import annotations

import torch

from ...model.attention import AttentionMetadata, paged_attention
from .chunk_rows import (
    LARGE_PACK_QUERIES,
    chunk_num_splits,
    large_pack_queries,
    paged_chunk_attention,
    rows_per_pack,
)
from .cold_prefix import cold_prefix_decode_attention
from .common import (
    INT4,
    INT8,
    MAX_SPLITS,
    MERGE_TILE_ELEMENTS,
    TILE_TOKENS,
    choose_num_splits,
    cold_kernels_take,
    split_buffers,
    split_counters,
)
from .hot import paged_decode_attention
from .mixed_cold import cold_paged_decode_attention
from .prefill import SDPA_BACKENDS, MixedStepAttention

__all__ = [
    "INT4",
    "INT8",
    "LARGE_PACK_QUERIES",
    "MAX_SPLITS",
    "MERGE_TILE_ELEMENTS",
    "SDPA_BACKENDS",
    "TILE_TOKENS",
    "choose_num_splits",
    "cold_kernels_take",
    "cold_paged_decode_attention",
    "cold_prefix_decode_attention",
    "chunk_num_splits",
    "large_pack_queries",
    "paged_chunk_attention",
    "paged_decode_attention",
    "rows_per_pack",
    "split_buffers",
    "split_counters",
    "triton_paged_attention",
]

_mixed_step = MixedStepAttention(paged_decode_attention, cold_paged_decode_attention, choose_num_splits)


def triton_paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float, cold=None
) -> torch.Tensor:
    """Drop-in for `paged_attention`: the Triton kernels for decode rows (hot blocks,
    cold blocks leading each table, or any mix), grouped SDPA for prefill rows (also
    over cold blocks); prefill over sliding windows, and cold blocks at a head dim the
    cold kernels do not take (cold_kernels_take): the portable path."""
    has_cold_blocks = cold is not None and getattr(meta, "block_kinds", None) is not None
    if has_cold_blocks and not cold_kernels_take(q.shape[-1]):
        return paged_attention(q, k_cache, v_cache, meta, scale, cold=cold)
    if meta.max_query_len != 1:
        if meta.sliding_window is not None:
            return paged_attention(q, k_cache, v_cache, meta, scale, cold=cold)
        return _mixed_step(q, k_cache, v_cache, meta, scale, cold=cold if has_cold_blocks else None)
    splits = choose_num_splits(meta.num_seqs, k_cache.shape[2], meta.max_context_len)
    if has_cold_blocks:
        kinds, slots = meta.block_kinds, meta.block_slots
        assert kinds is not None and slots is not None  # a batch with cold blocks sets both
        if meta.cold_prefix_blocks is not None:
            tables = meta.block_tables.to(torch.int32).contiguous()
            return cold_prefix_decode_attention(
                q,
                k_cache,
                v_cache,
                cold,
                tables,
                slots.to(torch.int32).contiguous(),
                meta.cold_prefix_blocks,
                meta.cold_prefix_kind,
                meta.context_lens,
                scale,
                splits,
                meta.sliding_window,
            )
        return cold_paged_decode_attention(
            q,
            k_cache,
            v_cache,
            cold,
            meta.block_tables,
            kinds,
            slots,
            meta.context_lens,
            scale,
            splits,
            meta.sliding_window,
        )
    return paged_decode_attention(
        q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale, splits, meta.sliding_window
    )


triton_paged_attention.supports_cold_kv = True  # type: ignore[attr-defined]  # mypy has no function attributes
