"""Attention for prefill and mixed steps on the fast path.

The portable path pads every sequence of a step to the longest query chunk and runs one
masked SDPA over the padded batch: in a mixed step (a prompt chunk of 512 tokens beside
200 decoding sequences) that is 200 x 512 padded query rows, and its mask is built from
host lists in every layer (a host sync per layer). Here a step is split instead:
- decode rows (one query token) go to the Triton decode kernel in one launch;
- prefill rows are grouped by (query length, context length); each group is one SDPA
  call over its sequences' gathered context, causal when the chunk is the whole context
  (flash attention), with a bottom-right causal mask when a cached prefix or an earlier
  chunk precedes it.
The index tensors and masks are built once per step (the first layer; one host sync for
the context lengths) and reused by every layer. With cold (quantized) blocks, decode
rows go to the cold-aware decode kernel and a prefill group's gathered context is
dequantized as it is gathered (that group's context only, for this layer; the cache
itself stays quantized). Sliding windows stay on the portable path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from ...memory.device_index import device_index
from ...model.attention import AttentionMetadata

# Not cuDNN's attention: it builds an execution plan for every new (sequences, query,
# context) shape, and a prefill group's shape depends on how the step's budget fell; the
# flash and memory-efficient kernels have no per-shape set-up. The step's caller enters
# `sdpa_kernel(SDPA_BACKENDS)` once for all its layers (FastDecoder.forward_step):
# entering it took 10 us of host time on a 2-core CPU, and an eager step is host-bound.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass(slots=True)
class PrefillGroup:
    query_len: int
    context_len: int
    token_rows: torch.Tensor  # [g * query_len] rows of the flat batch, sequence by sequence
    tables: torch.Tensor  # [g, blocks covering context_len], contiguous
    mask: torch.Tensor | None  # [query_len, context_len] bottom-right causal; None: plain causal
    kinds: torch.Tensor | None = None  # [g, blocks] kind codes and slots of cold entries (None: all hot)
    slots: torch.Tensor | None = None
    first_row: int | None = None  # set when token_rows is the range first_row.. (slices, not gathers)

    @property
    def num_seqs(self) -> int:
        return self.tables.shape[0]


@dataclass(slots=True)
class StepPlan:
    decode_rows: torch.Tensor | None
    decode_tables: torch.Tensor | None
    decode_context_lens: torch.Tensor | None
    decode_max_context: int
    groups: list[PrefillGroup]
    decode_kinds: torch.Tensor | None = None
    decode_slots: torch.Tensor | None = None


def _cold_entries(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(block_kinds, block_slots) when some block of the step is cold, else None."""
    if meta.block_kinds is None:
        return None
    assert meta.block_slots is not None  # a batch with cold blocks sets both
    return meta.block_kinds, meta.block_slots


def plan_step(meta: AttentionMetadata, block_size: int, device: torch.device) -> StepPlan:
    context_lens = meta.context_lens.tolist()
    cold = _cold_entries(meta)
    decode = [i for i, n in enumerate(meta.query_lens) if n == 1]
    decode_rows = decode_tables = decode_ctx = decode_kinds = decode_slots = None
    if decode:
        decode_seqs = device_index(decode, device)
        decode_rows = device_index([meta.query_start[i] for i in decode], device)
        decode_tables = meta.block_tables.index_select(0, decode_seqs)
        decode_ctx = meta.context_lens.index_select(0, decode_seqs)
        if cold is not None:
            decode_kinds = cold[0].index_select(0, decode_seqs)
            decode_slots = cold[1].index_select(0, decode_seqs)
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, n in enumerate(meta.query_lens):
        if n > 1:
            by_shape.setdefault((n, context_lens[i]), []).append(i)
    groups = []
    for (n, ctx), seqs in by_shape.items():
        rows = [r for i in seqs for r in range(meta.query_start[i], meta.query_start[i] + n)]
        blocks = -(-ctx // block_size)
        index = device_index(seqs, device)
        tables = meta.block_tables.index_select(0, index)[:, :blocks].contiguous()
        mask = None
        if ctx != n:  # query i sits at position ctx - n + i and sees keys up to it
            mask = torch.ones(n, ctx, dtype=torch.bool, device=device).tril_(diagonal=ctx - n)
        kinds = slots = None
        if cold is not None:
            kinds = cold[0].index_select(0, index)[:, :blocks]
            slots = cold[1].index_select(0, index)[:, :blocks]
        first_row = rows[0] if rows == list(range(rows[0], rows[0] + len(rows))) else None
        groups.append(PrefillGroup(n, ctx, device_index(rows, device), tables, mask, kinds, slots, first_row))
    return StepPlan(
        decode_rows,
        decode_tables,
        decode_ctx,
        max((context_lens[i] for i in decode), default=0),
        groups,
        decode_kinds,
        decode_slots,
    )


class MixedStepAttention:
    """Callable with `paged_attention`'s signature for steps with query_len > 1."""

    def __init__(self, decode_attention, cold_decode_attention, choose_splits):
        self.decode_attention = decode_attention
        self.cold_decode_attention = cold_decode_attention
        self.choose_splits = choose_splits
        self._plan_for: AttentionMetadata | None = None  # the step whose plan is cached
        self._plan: StepPlan | None = None

    def plan(self, meta: AttentionMetadata, block_size: int, device: torch.device) -> StepPlan:
        if self._plan_for is not meta:  # the same metadata object reaches every layer of a step
            self._plan = plan_step(meta, block_size, device)
            self._plan_for = meta
        assert self._plan is not None  # set together with _plan_for
        return self._plan

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        cold=None,
    ) -> torch.Tensor:
        _, block_size, kv_heads, head_dim = k_cache.shape
        tokens, heads = q.shape[0], q.shape[1]
        plan = self.plan(meta, block_size, q.device)
        group = heads // kv_heads
        if plan.decode_rows is None and len(plan.groups) == 1 and plan.groups[0].first_row == 0:
            g = plan.groups[0]  # one group of every row (a step of equal prompts): its output is the step's
            if g.num_seqs * g.query_len == tokens:
                return self._group(q, k_cache, v_cache, g, scale, cold, kv_heads, group).reshape_as(q)
        out = torch.empty_like(q)
        if plan.decode_rows is not None:
            num = plan.decode_rows.shape[0]
            splits = self.choose_splits(num, kv_heads, plan.decode_max_context)
            q_dec = q.index_select(0, plan.decode_rows)
            if cold is not None and plan.decode_kinds is not None:
                dec = self.cold_decode_attention(
                    q_dec,
                    k_cache,
                    v_cache,
                    cold,
                    plan.decode_tables,
                    plan.decode_kinds,
                    plan.decode_slots,
                    plan.decode_context_lens,
                    scale,
                    splits,
                )
            else:
                dec = self.decode_attention(
                    q_dec, k_cache, v_cache, plan.decode_tables, plan.decode_context_lens, scale, splits
                )
            out.index_copy_(0, plan.decode_rows, dec)
        for g in plan.groups:
            og = self._group(q, k_cache, v_cache, g, scale, cold, kv_heads, group)
            if g.first_row is not None:
                out[g.first_row : g.first_row + og.shape[0]] = og
            else:
                out.index_copy_(0, g.token_rows, og)
        return out

    @staticmethod
    def _group(q, k_cache, v_cache, g: PrefillGroup, scale: float, cold, kv_heads: int, group: int) -> torch.Tensor:
        """Attention of one prefill group: [g * query_len, heads, head_dim], sequence by sequence.
        Plain causal groups go to flash attention with its native GQA (K/V as gathered,
        not repeated per query head); masked ones (a cached prefix or earlier chunk
        before the chunk) take SDPA with the mask and K/V repeated."""
        seqs, n, ctx = g.num_seqs, g.query_len, g.context_len
        heads, head_dim = q.shape[1], q.shape[2]
        rows = q[g.first_row : g.first_row + seqs * n] if g.first_row is not None else q.index_select(0, g.token_rows)
        qg = rows.view(seqs, n, heads, head_dim).transpose(1, 2)
        native_gqa = g.mask is None

        def context(cache, which):  # [g, kv heads (or heads), ctx, D] through the tables
            # index_select of the flat table, not cache[g.tables]: the same gather, and
            # advanced indexing cost about 85 us of host time a call on the H200's host
            # (two a layer), which a short prompt's step waits for.
            blocks = cache.index_select(0, g.tables.view(-1)).view(*g.tables.shape, *cache.shape[1:])
            if cold is not None and g.kinds is not None:
                blocks = cold.gather(which, g.kinds, g.tables, g.slots, blocks, q.dtype)
            blocks = blocks.reshape(seqs, -1, kv_heads, head_dim)[:, :ctx].transpose(1, 2)
            return blocks if native_gqa else blocks.repeat_interleave(group, dim=1)

        kg, vg = context(k_cache, 0).to(q.dtype), context(v_cache, 1).to(q.dtype)
        if g.mask is None:
            og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, scale=scale, enable_gqa=group > 1)
        else:
            og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, scale=scale)
        return og.transpose(1, 2).reshape(seqs * n, heads, head_dim)
