"""Deterministic mode: a forward whose result for one token does not depend on the batch.

A GEMM, a norm or an attention kernel is chosen (and split, tiled and vectorised) by the
shape of its whole input, so the same row computed in a batch of 1 and in a batch of 200
can differ in the last bits; in bf16 one such bit flips a greedy token now and then, and
the outputs diverge from there. `EngineConfig(deterministic=True)` (`inferd serve
--deterministic`) runs the model through the steps below instead, where every kernel sees
a shape that depends only on the token itself:

- projections (attention, MLP, LM head) go through one matrix product whose reduction
  is fixed: on a GPU a Triton kernel that walks K in one fixed step order, no split-K
  (fast_path/invariant_matmul.py), elsewhere torch's GEMM over fixed tiles of `ROW_TILE`
  rows, the last zero-padded;
- norms, RoPE and the elementwise steps: on a GPU the fast path's fused kernels, one
  program a row whatever the number of rows (batch_invariant_fused.py); elsewhere in
  fixed `ROW_TILE` tiles, so each is the same launch whatever the number of rows; no
  kernel mixes rows, so a row's result never depends on the others in its tile;
- attention is computed for each query token alone over exactly its own context (its
  sequence's keys up to and including itself): on a GPU each token is a row of the Triton
  decode kernel with a fixed split count, elsewhere one SDPA per token; what a row reads
  depends only on its context, so neither the other sequences of the step nor how a
  prompt was split into prefill chunks, nor a prefix-cache hit, changes a bit.

The result: a request's greedy (and seeded) tokens and logprobs are bitwise the same alone
and inside any batch. Decode steps replay CUDA graphs of these steps on a GPU
(batch_invariant_graphs.py). The cost is speed (the fast path's fused kernels, and
prefill attention reads each token's whole context): measured in BENCHMARKS.md.
Tensor parallelism is refused in this mode (its all-reduce is another shape-dependent
reduction, not covered here).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..fast_path.availability import unavailable_reason
from ..model.attention import AttentionMetadata, write_kv
from ..model.model import DecoderLayer, LayerOps, LlamaModel, apply_rope

ROW_TILE = {"cpu": 32, "cuda": 256}
"""Rows per fixed-shape tile, per device type: one launch of a tiled step each. On the CPU
a tile of the GEMM reads every weight once, so tiles stay small for small batches; on a
GPU only norms and elementwise steps are tiled (projections are one fixed-tiling kernel)."""

TileFn = Callable[..., tuple[torch.Tensor, ...]]


def tiled(fn: TileFn, tile: int, *rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`fn` over `rows` (tensors sharing their first dimension) in tiles of `tile` rows,
    the last zero-padded; `fn` returns a tuple of per-row tensors, concatenated back and
    cut to the true row count."""
    count = rows[0].shape[0]
    pad = (-count) % tile
    if pad:
        rows = tuple(torch.cat([r, r.new_zeros(pad, *r.shape[1:])]) for r in rows)
    pieces = [fn(*(r[i : i + tile] for r in rows)) for i in range(0, count + pad, tile)]
    return tuple(torch.cat(parts)[:count] for parts in zip(*pieces))


def tiled_linear(layer: torch.nn.Linear, x: torch.Tensor, tile: int) -> torch.Tensor:
    return tiled(lambda rows: (layer(rows),), tile, x)[0]


DEVICE_SPLITS = 8
"""Splits of the Triton decode kernel in this mode: fixed, so where a row's context is
split, and the order its splits merge in, depend on that row's context alone (the fast
path picks the count from the batch)."""


def invariant_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    cold=None,
) -> torch.Tensor:
    """Drop-in for `paged_attention` (same arguments, same result to rounding): each query
    token attends alone over its own context, so its result depends on nothing else in
    the step. The step's K/V are already written. On a GPU the fast path runs on, every
    token is one row of the Triton decode kernel (one launch); elsewhere, and over cold
    blocks or a sliding window, one SDPA per token."""
    if cold is None and meta.sliding_window is None and unavailable_reason(q.device, q.dtype) is None:
        return _token_rows_on_device(q, k_cache, v_cache, meta, scale)
    return _token_by_token(q, k_cache, v_cache, meta, scale, cold)


def _token_rows_on_device(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    # imported here: importing the package defines (and on the CPU cannot build) the kernels
    from ..fast_path.attention import paged_decode_attention

    tables, context = _token_rows(meta, q.device)
    return paged_decode_attention(q.contiguous(), k_cache, v_cache, tables, context, scale, DEVICE_SPLITS)


_rows_of_step: tuple[AttentionMetadata, torch.Tensor, torch.Tensor] | None = None


def _token_rows(meta: AttentionMetadata, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query token: its sequence's block table and its own context length. Built once
    per step (every layer attends with the same metadata)."""
    global _rows_of_step
    if _rows_of_step is not None and _rows_of_step[0] is meta:
        return _rows_of_step[1], _rows_of_step[2]
    if meta.max_query_len == 1 and sum(meta.query_lens) == meta.num_seqs:
        # A decode step: the rows are the sequences themselves. Nothing is copied from
        # the host, so the step can be captured in a CUDA graph (batch_invariant_graphs.py).
        _rows_of_step = (meta, meta.block_tables.to(device), meta.context_lens.to(device))
        return _rows_of_step[1], _rows_of_step[2]
    query_lens = torch.tensor(meta.query_lens, device=device)
    seq_of_token = torch.repeat_interleave(torch.arange(len(meta.query_lens), device=device), query_lens)
    starts = torch.tensor(meta.query_start, device=device)
    offset = torch.arange(int(sum(meta.query_lens)), device=device) - starts[seq_of_token]
    context = meta.context_lens.to(device)[seq_of_token] - query_lens[seq_of_token] + 1 + offset
    tables = meta.block_tables.to(device)[seq_of_token]
    _rows_of_step = (meta, tables, context.to(meta.context_lens.dtype))
    return tables, _rows_of_step[2]


def _token_by_token(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    cold,
) -> torch.Tensor:
    _, block_size, kv_heads, head_dim = k_cache.shape
    heads = q.shape[1]
    out = torch.empty_like(q)
    context_lens = meta.context_lens.tolist()
    for s, (start, count) in enumerate(zip(meta.query_start, meta.query_lens)):
        if count == 0:
            continue
        ctx = context_lens[s]
        blocks = (ctx + block_size - 1) // block_size
        table = meta.block_tables[s, :blocks]
        k_blocks, v_blocks = k_cache[table], v_cache[table]
        if cold is not None and meta.block_kinds is not None:
            assert meta.block_slots is not None  # set together with block_kinds
            kinds, slots = meta.block_kinds[s : s + 1, :blocks], meta.block_slots[s : s + 1, :blocks]
            k_blocks = cold.gather(0, kinds, table[None], slots, k_blocks[None], q.dtype)[0]
            v_blocks = cold.gather(1, kinds, table[None], slots, v_blocks[None], q.dtype)[0]
        keys = k_blocks.reshape(blocks * block_size, kv_heads, head_dim)[:ctx].transpose(0, 1).to(q.dtype)
        values = v_blocks.reshape(blocks * block_size, kv_heads, head_dim)[:ctx].transpose(0, 1).to(q.dtype)
        for j in range(count):
            seen = ctx - count + 1 + j  # this token's context, itself included
            first = 0 if meta.sliding_window is None else max(0, seen - meta.sliding_window)
            attended = F.scaled_dot_product_attention(
                q[start + j].reshape(1, heads, 1, head_dim),
                keys[None, :, first:seen],
                values[None, :, first:seen],
                scale=scale,
                enable_gqa=kv_heads != heads,
            )
            out[start + j] = attended[0, :, 0]
    return out


def invariant_projection(
    device: torch.device, dtype: torch.dtype
) -> Callable[[torch.nn.Linear, torch.Tensor], torch.Tensor]:
    """How this mode multiplies by a weight on `device`: on a GPU the fast path runs on,
    one launch of the fixed-tiling Triton matmul over all rows; elsewhere torch's GEMM
    over fixed row tiles."""
    if unavailable_reason(device, dtype) is None:
        # imported here: importing the module defines (and on the CPU cannot build) the kernel
        from ..fast_path.invariant_matmul import invariant_linear

        return lambda layer, x: invariant_linear(x, layer.weight, layer.bias)
    tile = ROW_TILE[device.type]
    return lambda layer, x: tiled_linear(layer, x, tile)


class BatchInvariantOps(LayerOps):
    """LayerOps whose steps see no shape but their own row's: projections through
    `invariant_projection`, norms, RoPE and the elementwise steps in fixed ROW_TILE tiles
    (see the module docstring); the order of the steps and the residual bookkeeping are
    LayerOps'."""

    def __init__(self, model: LlamaModel, positions: torch.Tensor, slots: torch.Tensor, attend):
        super().__init__(model, positions, slots, attend)
        weight = model.embed_tokens.weight
        self.tile = ROW_TILE[weight.device.type]
        self.project = invariant_projection(weight.device, weight.dtype)

    def _add_norm(self, norm: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor | None):
        if residual is None:
            return norm_rows(norm, x, self.tile), x
        return tiled(lambda x_rows, r_rows: (norm(r_rows + x_rows), r_rows + x_rows), self.tile, x, residual)

    def attention_input(self, layer: DecoderLayer, x, residual, kv) -> tuple[torch.Tensor, torch.Tensor]:
        attn = layer.self_attn
        h, residual = self._add_norm(layer.input_layernorm, x, residual)
        t = h.shape[0]
        q = self.project(attn.q_proj, h).view(t, attn.num_heads, attn.head_dim)
        k = self.project(attn.k_proj, h).view(t, attn.num_kv_heads, attn.head_dim)
        v = self.project(attn.v_proj, h).view(t, attn.num_kv_heads, attn.head_dim)

        def rope(q_rows, k_rows, positions):
            cos, sin = self.model.rotary(positions, q_rows.dtype)
            return apply_rope(q_rows, cos, sin), apply_rope(k_rows, cos, sin)

        q, k = tiled(rope, self.tile, q, k, self.positions)
        write_kv(kv[0], kv[1], k, v, self.slots)
        return q, residual

    def attention_output(self, layer: DecoderLayer, out: torch.Tensor) -> torch.Tensor:
        return self.project(layer.self_attn.o_proj, out.reshape(out.shape[0], -1))

    def mlp(self, layer: DecoderLayer, x, residual) -> tuple[torch.Tensor, torch.Tensor]:
        mlp = layer.mlp
        h, residual = self._add_norm(layer.post_attention_layernorm, x, residual)
        gate, up = self.project(mlp.gate_proj, h), self.project(mlp.up_proj, h)
        (act,) = tiled(lambda g, u: (F.silu(g) * u,), self.tile, gate, up)
        return self.project(mlp.down_proj, act), residual

    def final_norm(self, x, residual) -> torch.Tensor:
        return self._add_norm(self.model.norm, x, residual)[0]


def norm_rows(norm: torch.nn.Module, x: torch.Tensor, tile: int) -> torch.Tensor:
    return tiled(lambda rows: (norm(rows),), tile, x)[0]


def make_batch_invariant(model: LlamaModel) -> None:
    """Switch `model`'s forward and LM head to the batch-invariant steps (for good: an
    engine in the default mode needs a model of its own)."""
    weight = model.embed_tokens.weight
    project = invariant_projection(weight.device, weight.dtype)
    model.step_ops = BatchInvariantOps
    if unavailable_reason(weight.device, weight.dtype) is None:
        # imported here: importing the module defines (and on the CPU cannot build) the kernels
        from .batch_invariant_fused import FusedInvariantOps

        model.step_ops = FusedInvariantOps
    model.attention_override = invariant_attention
    model.lm_head_fn = lambda hidden: project(model.lm_head, hidden)
