"""One forward of a model shard, the same on every rank.

Ranks must run the same collectives in the same order, so a fast-path attention
failure on one rank must not skip the rest of its forward: the guard records it,
returns zeros instead, and after the forward the ranks all-reduce a failure flag, so
all of them learn of it together and rank 0 re-runs the step on the portable path.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..model.attention import AttentionMetadata
from .sharded_model import ShardedLlamaModel


class GuardedAttention:
    def __init__(self, fn):
        self.fn = fn
        self.error: Exception | None = None
        self.supports_cold_kv = getattr(fn, "supports_cold_kv", False)

    def __call__(self, q, k_cache, v_cache, meta, scale, **kwargs):
        if self.error is None:
            try:
                return self.fn(q, k_cache, v_cache, meta, scale, **kwargs)
            except Exception as exc:  # reported to every rank after the forward
                self.error = exc
        return torch.zeros_like(q)


def run_shard(
    model: ShardedLlamaModel,
    input_ids: torch.Tensor,
    meta: AttentionMetadata,
    kv_layers: list,
    attention_fn,
    sample_rows: list[int],
) -> tuple[torch.Tensor | None, bool, Exception | None]:
    """(logits on rank 0 else None, whether attention failed on any rank, this rank's error)."""
    guarded = GuardedAttention(attention_fn)
    hidden = model(input_ids, meta, kv_layers, guarded)
    logits = model.compute_logits(hidden[sample_rows]) if sample_rows else None
    flag = torch.tensor([1 if guarded.error is not None else 0], dtype=torch.int32, device=hidden.device)
    model.timer.run(dist.all_reduce, flag, op=dist.ReduceOp.MAX)
    return logits, bool(flag.item()), guarded.error


def meta_to(meta: AttentionMetadata, device: torch.device) -> AttentionMetadata:
    """A copy of `meta` with its tensors on `device`."""

    def move(t):
        return None if t is None else t.to(device)

    return AttentionMetadata(
        query_start=list(meta.query_start),
        query_lens=list(meta.query_lens),
        context_lens=move(meta.context_lens),
        block_tables=move(meta.block_tables),
        slot_mapping=move(meta.slot_mapping),
        positions=move(meta.positions),
        max_query_len=meta.max_query_len,
        max_context_len=meta.max_context_len,
        sliding_window=meta.sliding_window,
        block_kinds=move(meta.block_kinds),
        block_slots=move(meta.block_slots),
    )
