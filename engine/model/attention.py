"""Paged attention, portable torch path.

K/V live in one pool per layer, ``[num_blocks, block_size, num_kv_heads, head_dim]``,
and each sequence reaches its tokens through its block table. A step's new K/V are
written into the pool at ``slot_mapping`` first; attention then reads every sequence's
context through its block table (one batched index into the pool, the pool itself is
never copied or reordered) with a mask that is causal within the step's queries,
limited to the sequence's context length, and (Mistral) to a sliding window.

The fast path (Triton kernels, CUDA graphs) plugs in behind the same
`AttentionMetadata`; this module stays the reference and the fallback.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class AttentionMetadata:
    """What one forward pass needs to know about the batch's layout in the KV pool."""

    query_start: list[int]  # per sequence, offset of its first query token in the flat batch
    query_lens: list[int]  # tokens computed this step per sequence
    context_lens: torch.Tensor  # [B] tokens in the cache after this step (incl. new ones)
    block_tables: torch.Tensor  # [B, max_blocks] block ids, padded with 0
    slot_mapping: torch.Tensor  # [T] flat slot (block * block_size + offset) of each new token
    positions: torch.Tensor  # [T]
    max_query_len: int
    max_context_len: int
    sliding_window: int | None = None
    # Set only when some block in the batch is cold (quantized): per table entry, the
    # kind (0 hot, 1 int8, 2 int4) and the slot within its page. block_tables then
    # holds each entry's page.
    block_kinds: torch.Tensor | None = None
    block_slots: torch.Tensor | None = None
    # Set when, in every row, the cold blocks are a leading run of one kind
    # (fast_path/cold_layout.py): per row the run's length, and the kind's code.
    cold_prefix_blocks: torch.Tensor | None = None
    cold_prefix_kind: int = 0
    # The portable path's attention mask, built by the first layer and reused by the others
    # (it depends on the batch's layout only): per layer it was an eighth of a host-bound
    # step (scripts/bench_fallback_host.py).
    _mask: tuple[torch.Tensor | None, bool] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    def sdpa_mask(self, device: torch.device) -> tuple[torch.Tensor | None, bool]:
        """(attn_mask, is_causal) for this step's SDPA calls. One sequence needs no mask
        when its queries are its whole context (a fresh prompt: causal) or one token that
        sees all of it (decode), within any sliding window; SDPA then takes its fused
        kernels (flash attention on a GPU), as transformers does."""
        if self._mask is None:
            ctx, qlen = self.max_context_len, self.max_query_len
            within_window = self.sliding_window is None or ctx <= self.sliding_window
            if self.num_seqs == 1 and within_window and qlen in (1, ctx):
                self._mask = (None, qlen > 1)
            else:
                self._mask = (build_mask(self, device), False)
        return self._mask


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor
) -> None:
    """Store this step's K/V at their slots (page * block_size + offset). New tokens
    always land in hot blocks. The caches are strided views of the page arena."""
    block_size = k_cache.shape[1]
    pages, offsets = slots // block_size, slots % block_size
    k_cache[pages, offsets] = k.to(k_cache.dtype)
    v_cache[pages, offsets] = v.to(v_cache.dtype)


def _padded_queries(q: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """[T, H, D] flat queries -> [B, H, max_q, D], zero-padded."""
    batch, heads, dim = meta.num_seqs, q.shape[1], q.shape[2]
    if batch == 1:
        return q.transpose(0, 1).unsqueeze(0)
    if all(n == 1 for n in meta.query_lens):  # pure decode
        return q.unsqueeze(2)
    out = q.new_zeros(batch, meta.max_query_len, heads, dim)
    for i, (start, n) in enumerate(zip(meta.query_start, meta.query_lens)):
        out[i, :n] = q[start : start + n]
    return out.transpose(1, 2)


def _unpad(out: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """[B, H, max_q, D] -> [T, H, D]."""
    if meta.num_seqs == 1:
        return out[0].transpose(0, 1)
    if all(n == 1 for n in meta.query_lens):
        return out[:, :, 0]
    out = out.transpose(1, 2)
    return torch.cat([out[i, :n] for i, n in enumerate(meta.query_lens)], dim=0)


def build_mask(meta: AttentionMetadata, device: torch.device) -> torch.Tensor:
    """Boolean [B, 1, max_q, max_ctx]: True where query i of sequence b may see key j."""
    qlens = torch.tensor(meta.query_lens, device=device)
    ctx = meta.context_lens.to(device)
    q_idx = torch.arange(meta.max_query_len, device=device)
    k_idx = torch.arange(meta.max_context_len, device=device)
    # absolute position of query i: ctx - qlen + i
    q_pos = (ctx - qlens)[:, None] + q_idx[None, :]  # [B, max_q]
    mask = k_idx[None, None, :] <= q_pos[:, :, None]
    mask &= k_idx[None, None, :] < ctx[:, None, None]
    if meta.sliding_window is not None:
        mask &= k_idx[None, None, :] > q_pos[:, :, None] - meta.sliding_window
    # Padding query rows would see nothing and softmax to NaN; let them see key 0.
    pad_rows = q_idx[None, :] >= qlens[:, None]
    mask[:, :, 0] |= pad_rows
    return mask.unsqueeze(1)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    cold=None,
) -> torch.Tensor:
    """q: [T, H, D] (keys/values of this step already written). Returns [T, H, D].
    `cold` (a kv_cache.ColdLayer) is given when the batch has quantized blocks: they are
    dequantized as they are gathered, never written back in full precision."""
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    heads = q.shape[1]
    ctx_blocks = (meta.max_context_len + block_size - 1) // block_size
    tables = meta.block_tables[:, :ctx_blocks]
    batch = meta.num_seqs
    # [B, blocks, bs, kvH, D] -> [B, kvH, ctx, D]: the sequence's context, through its table.
    # index_select of whole blocks: on a host-bound CPU run a batch of 32 went from 0.85x to
    # 1.0x of eager transformers against indexing with the 2-D table (scripts/bench_fallback_host.py).
    flat = tables.reshape(-1)
    k_blocks = k_cache.index_select(0, flat).view(batch, ctx_blocks, block_size, kv_heads, head_dim)
    v_blocks = v_cache.index_select(0, flat).view(batch, ctx_blocks, block_size, kv_heads, head_dim)
    if cold is not None and meta.block_kinds is not None:
        assert meta.block_slots is not None  # set together with block_kinds
        kinds, slots = meta.block_kinds[:, :ctx_blocks], meta.block_slots[:, :ctx_blocks]
        k_blocks = cold.gather(0, kinds, tables, slots, k_blocks, q.dtype)
        v_blocks = cold.gather(1, kinds, tables, slots, v_blocks, q.dtype)
    k = k_blocks.reshape(batch, ctx_blocks * block_size, kv_heads, head_dim)[:, : meta.max_context_len]
    v = v_blocks.reshape(batch, ctx_blocks * block_size, kv_heads, head_dim)[:, : meta.max_context_len]
    if cold is not None:
        # With cold KV a page may last have held quantized bytes: past a sequence's
        # context (table padding, the unwritten tail of its last block) they read as
        # arbitrary floats, NaN included, and 0 x NaN would leak through the softmax.
        outside = (
            torch.arange(meta.max_context_len, device=q.device)[None, :] >= meta.context_lens.to(q.device)[:, None]
        )
        k = k.masked_fill(outside[:, :, None, None], 0)
        v = v.masked_fill(outside[:, :, None, None], 0)
    k = k.transpose(1, 2).to(q.dtype)
    v = v.transpose(1, 2).to(q.dtype)
    qp = _padded_queries(q, meta)
    mask, causal = meta.sdpa_mask(q.device)
    # enable_gqa lets each K/V head serve its group of query heads without a copy.
    out = F.scaled_dot_product_attention(
        qp, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=kv_heads != heads
    )
    return _unpad(out, meta)


# the portable path dequantizes cold blocks itself; runners read the flag with getattr
paged_attention.supports_cold_kv = True  # type: ignore[attr-defined]  # mypy has no function attributes
