"""Paged decode attention in Triton: flash-decoding over the block tables.

One program per (sequence, KV head, split). It loads the whole GQA group of query
heads that share the KV head (padded to 16 rows for the tensor-core dot), so each
K/V block is read from memory once per step, not once per query head. A sequence's
context is cut into `num_splits` tile-aligned ranges computed from its own length
inside the kernel (no host knowledge of lengths, so a captured CUDA graph stays valid
for any context); each split writes its normalised partial output and log-sum-exp,
and the last split of a sequence's KV head to finish merges them (a counter per
(sequence, KV head); at batch 1 a second merge launch cost 3.8 us per layer). bf16/fp16
in, fp32 softmax and accumulation.

Padded rows of a CUDA-graph batch have context length 0: every split is empty and
the output is zeros (never NaN).

Prefill and mixed prefill/decode steps: decode rows through this kernel, prefill rows
through SDPA over the gathered context, grouped by shape (prefill_attention.py).
"""
from __future__ import annotations

import torch

from ..attention import AttentionMetadata, paged_attention
from .availability import has_triton
from .pdl import pdl_launch
from .prefill_attention import MixedStepAttention

TILE_TOKENS = 64  # keys per inner iteration (several KV blocks)
MAX_SPLITS = 64
TARGET_PROGRAMS = 2 * 132  # two waves' worth on an H200's 132 SMs

if has_triton():
    import triton
    import triton.language as tl

    from .pdl import release_dependents, wait_for_previous

    @triton.jit
    def _split_bounds(ctx_ptr, b, split, window, NUM_SPLITS: tl.constexpr, TILE: tl.constexpr):
        """(context length, first key, end) of this program's split: the sequence's keys
        (the last `window` of them with a sliding window) cut into tile-aligned parts."""
        ctx = tl.load(ctx_ptr + b).to(tl.int32)
        first = tl.where(window > 0, tl.maximum(ctx - window, 0), 0)
        per_split = tl.cdiv(tl.cdiv(ctx - first, NUM_SPLITS), TILE) * TILE
        lo = first + split * per_split
        return ctx, lo, tl.minimum(lo + per_split, ctx)

    @triton.jit
    def _splits_with_keys(ctx, window, NUM_SPLITS: tl.constexpr, TILE: tl.constexpr):
        """How many of the sequence's leading splits (_split_bounds) hold keys; at least 1,
        so that a sequence without keys still gets its (zero) output from split 0."""
        first = tl.where(window > 0, tl.maximum(ctx - window, 0), 0)
        per_split = tl.cdiv(tl.cdiv(ctx - first, NUM_SPLITS), TILE) * TILE
        return tl.maximum(tl.cdiv(ctx - first, tl.maximum(per_split, 1)), 1)

    @triton.jit
    def _group_queries(q_ptr, b, kvh, stride_qb, stride_qh,
                       GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr):
        """The query heads sharing KV head `kvh`, padded to GROUP_PAD rows of zeros."""
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, HEAD_DIM)
        heads = kvh * GROUP + g
        is_head = g < GROUP
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=is_head[:, None], other=0.0)
        return q, heads, is_head, d

    @triton.jit
    def _softmax_update(q, k, v, k_scale, v_scale, in_range, m_i, l_i, acc, scale):
        """One tile of online softmax; per-token scales multiply the scores (keys) and the
        probabilities (values): how the cold kernels dequantize without a copy."""
        s = tl.dot(q, tl.trans(k)) * (k_scale[None, :] * scale)
        return _softmax_update_scores(s, v, v_scale, in_range, m_i, l_i, acc)

    @triton.jit
    def _softmax_update_scores(s, v, v_scale, in_range, m_i, l_i, acc):
        """The online-softmax update for one tile's scaled scores `s` [rows, tile]."""
        s = tl.where(in_range[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot((p * v_scale[None, :]).to(v.dtype), v)
        return m_new, l_i, acc

    @triton.jit
    def _store_split(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, b, heads, is_head, d, split,
                     stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                     NUM_SPLITS: tl.constexpr):
        """A split's normalised partial output and log-sum-exp (or, unsplit, the output)."""
        has_keys = l_i > 0
        safe_l = tl.where(has_keys, l_i, 1.0)
        part = acc / safe_l[:, None]
        if NUM_SPLITS == 1:
            tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                     part.to(out_ptr.dtype.element_ty), mask=is_head[:, None])
        else:
            tl.store(part_ptr + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps + d[None, :],
                     part, mask=is_head[:, None])
            lse = tl.where(has_keys, m_i + tl.log(safe_l), float("-inf"))
            tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=is_head)

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
        EARLY_RELEASE: tl.constexpr, INPUTS_READY: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        # INPUTS_READY: the context lengths were written before the previous kernel (a
        # decode step's inputs), so they are read before waiting for it (pdl.py); q, the
        # tables and the caches only after.
        if not INPUTS_READY:
            wait_for_previous(USE_PDL)
        ctx, lo, hi = _split_bounds(ctx_ptr, b, split, window, NUM_SPLITS, TILE)
        # Splits past the keys do nothing, and the merge reads only those with keys: the
        # graphs fix NUM_SPLITS for the longest context, so at short ones most are empty
        # (a batch-1 step at context 640 fills 10 of 64).
        used = _splits_with_keys(ctx, window, NUM_SPLITS, TILE)
        if split < used:
            if INPUTS_READY:
                wait_for_previous(USE_PDL)
            q, heads, is_head, d = _group_queries(q_ptr, b, kvh, stride_qb, stride_qh, GROUP, GROUP_PAD, HEAD_DIM)
            m_i = tl.full([GROUP_PAD], -1e30, tl.float32)
            l_i = tl.zeros([GROUP_PAD], tl.float32)
            acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
            for start in range(lo, hi, TILE):
                t = start + tl.arange(0, TILE)
                in_range = t < hi
                block = tl.load(tables_ptr + b * stride_tb + t // BLOCK_SIZE, mask=in_range, other=0)
                offs = block.to(tl.int64) * stride_kb + (t % BLOCK_SIZE) * stride_kt + kvh * stride_kh
                k = tl.load(k_ptr + offs[:, None] + d[None, :], mask=in_range[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k)) * scale
                s = tl.where(in_range[None, :], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                p = tl.exp(s - m_new[:, None])
                alpha = tl.exp(m_i - m_new)
                l_i = l_i * alpha + tl.sum(p, 1)
                v = tl.load(v_ptr + offs[:, None] + d[None, :], mask=in_range[:, None], other=0.0)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m_i = m_new

            release_dependents(USE_PDL, EARLY_RELEASE)
            _store_split(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, b, heads, is_head, d, split,
                         stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh, NUM_SPLITS)
            if NUM_SPLITS > 1:
                # The last split of (b, kvh) to finish merges the group's heads (no second
                # launch) and re-arms the counter for the next step (and graph replay).
                tl.debug_barrier()  # every thread's partial stores before the release below
                counter = done_ptr + b * tl.num_programs(1) + kvh
                if tl.atomic_add(counter, 1, sem="acq_rel") == used - 1:
                    _merge_group(part_ptr, lse_ptr, out_ptr, b, kvh, used, stride_pb, stride_ph, stride_ps,
                                 stride_lb, stride_lh, stride_ob, stride_oh, GROUP, HEAD_DIM)
                    tl.atomic_xchg(counter, 0)

    @triton.jit
    def _merge_group(part_ptr, lse_ptr, out_ptr, b, kvh, used, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                     stride_ob, stride_oh, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr):
        """The outputs of KV head kvh's GROUP query heads from their first `used` splits,
        all heads at once (one round of loads per SPLIT_CHUNK splits, not one per head),
        with a running maximum of the log-sum-exps across chunks."""
        GROUP_P2: tl.constexpr = triton.next_power_of_2(GROUP)
        SPLIT_CHUNK: tl.constexpr = 16
        g = tl.arange(0, GROUP_P2)
        is_head = g < GROUP
        heads = kvh * GROUP + g
        d = tl.arange(0, HEAD_DIM)
        top = tl.full([GROUP_P2], float("-inf"), tl.float32)
        total = tl.zeros([GROUP_P2], tl.float32)
        acc = tl.zeros([GROUP_P2, HEAD_DIM], tl.float32)
        for c0 in range(0, used, SPLIT_CHUNK):
            sp = c0 + tl.arange(0, SPLIT_CHUNK)
            valid = is_head[:, None] & (sp < used)[None, :]
            # .cg: the splits were written by other programs, possibly on other SMs (L1 is not coherent)
            lse = tl.load(lse_ptr + b * stride_lb + heads[:, None] * stride_lh + sp[None, :], mask=valid,
                          other=float("-inf"), cache_modifier=".cg")
            parts = tl.load(part_ptr + b * stride_pb + heads[:, None, None] * stride_ph + sp[None, :, None] * stride_ps
                            + d[None, None, :], mask=valid[:, :, None], other=0.0, cache_modifier=".cg")
            new_top = tl.maximum(top, tl.max(lse, 1))
            safe_top = tl.where(new_top == float("-inf"), 0.0, new_top)
            weight = tl.exp(lse - safe_top[:, None])
            rescale = tl.exp(top - safe_top)
            total = total * rescale + tl.sum(weight, 1)
            acc = acc * rescale[:, None] + tl.sum(parts * weight[:, :, None], 1)
            top = new_top
        merged = acc / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :], merged.to(out_ptr.dtype.element_ty),
                 mask=is_head[:, None])

    @triton.jit
    def _merge_head(part_ptr, lse_ptr, out_ptr, b, h, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                    stride_ob, stride_oh, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr):
        """Head h's output from its splits' partial outputs, weighted by their log-sum-exps."""
        s = tl.arange(0, NUM_SPLITS)
        d = tl.arange(0, HEAD_DIM)
        # .cg: the splits were written by other programs, possibly on other SMs (L1 is not coherent)
        lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + s, cache_modifier=".cg")
        top = tl.max(lse, 0)
        top = tl.where(top == float("-inf"), 0.0, top)
        weight = tl.exp(lse - top)
        total = tl.sum(weight, 0)
        parts = tl.load(part_ptr + b * stride_pb + h * stride_ph + s[:, None] * stride_ps + d[None, :],
                        cache_modifier=".cg")
        merged = tl.sum(parts * weight[:, None], 0) / tl.where(total > 0, total, 1.0)
        tl.store(out_ptr + b * stride_ob + h * stride_oh + d, merged.to(out_ptr.dtype.element_ty))

    @triton.jit
    def _merge_splits_kernel(
        part_ptr, lse_ptr, out_ptr,
        stride_pb, stride_ph, stride_ps,
        stride_lb, stride_lh,
        stride_ob, stride_oh,
        HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, USE_PDL: tl.constexpr,
    ):
        wait_for_previous(USE_PDL)
        _merge_head(part_ptr, lse_ptr, out_ptr, tl.program_id(0), tl.program_id(1), stride_pb, stride_ph, stride_ps,
                    stride_lb, stride_lh, stride_ob, stride_oh, HEAD_DIM, NUM_SPLITS)


def choose_num_splits(batch: int, num_kv_heads: int, max_context_len: int,
                      target_programs: int = TARGET_PROGRAMS) -> int:
    """Power of two: enough programs to fill the GPU, but no split shorter than one tile."""
    splits = 1
    while (batch * num_kv_heads * splits < target_programs and splits < MAX_SPLITS
           and splits * 2 * TILE_TOKENS <= max_context_len):
        splits *= 2
    return splits


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           num_splits: int, sliding_window: int | None = None,
                           inputs_ready: bool = False) -> torch.Tensor:
    """One query token per sequence. q: [B, H, D] (last dim contiguous); caches
    [num_blocks, block_size, kv_heads, D]; returns [B, H, D] in q's dtype.
    `inputs_ready`: context_lens and block_tables were written before the kernel
    launched just before this one (a decode step's inputs, copied in before its first
    kernel), so with PDL the kernel may read them before waiting for that kernel."""
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, cache_dim = k_cache.shape
    if cache_dim != head_dim or heads % kv_heads:
        raise ValueError(f"q {tuple(q.shape)} does not fit the KV cache {tuple(k_cache.shape)}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("K and V caches must share strides with a contiguous head dimension")
    if num_splits < 1 or num_splits & (num_splits - 1):
        raise ValueError(f"num_splits must be a power of two, got {num_splits}")
    group = heads // kv_heads
    out, part, lse = split_buffers(q, num_splits)
    _decode_split_kernel[(batch, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, part, lse, out, split_counters(q.device, batch * kv_heads),
        scale, sliding_window or 0,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        part.stride(0), part.stride(1), part.stride(2) if num_splits > 1 else 0,
        lse.stride(0), lse.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, TILE=TILE_TOKENS, NUM_SPLITS=num_splits, INPUTS_READY=inputs_ready,
        **pdl_launch(q.device, releases=True),
    )
    return out


_split_counters: dict[torch.device, list[torch.Tensor]] = {}


def split_counters(device: torch.device, count: int) -> torch.Tensor:
    """Zeroed int32 counters of finished splits, one per (sequence, KV head); each
    launch leaves them at zero again. One buffer per device, grown when a launch needs
    more; outgrown buffers are kept, as captured CUDA graphs still point at them."""
    buffers = _split_counters.setdefault(device, [])
    if not buffers or buffers[-1].numel() < count:
        buffers.append(torch.zeros(max(count, 2 * buffers[-1].numel() if buffers else 1024), dtype=torch.int32,
                                   device=device))
    return buffers[-1]


def split_buffers(q: torch.Tensor, num_splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, partial outputs, log-sum-exps) for a split decode launch; unsplit, the
    partial buffers are `out` itself (the kernel does not touch them)."""
    batch, heads, head_dim = q.shape
    out = torch.empty(batch, heads, head_dim, dtype=q.dtype, device=q.device)
    if num_splits == 1:
        return out, out, out
    part = torch.empty(batch, heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(batch, heads, num_splits, dtype=torch.float32, device=q.device)
    return out, part, lse


def merge_splits(out: torch.Tensor, part: torch.Tensor, lse: torch.Tensor, num_splits: int) -> None:
    if num_splits == 1:
        return
    batch, heads, head_dim = out.shape
    _merge_splits_kernel[(batch, heads)](
        part, lse, out,
        part.stride(0), part.stride(1), part.stride(2),
        lse.stride(0), lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, NUM_SPLITS=num_splits, **pdl_launch(out.device),
    )


_mixed_step = MixedStepAttention(paged_decode_attention, choose_num_splits)


def triton_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           meta: AttentionMetadata, scale: float, cold=None) -> torch.Tensor:
    """Drop-in for `paged_attention`: Triton for decode rows (hot blocks, or hot and cold
    blocks in one pass: triton_cold_attention.py), grouped SDPA for prefill rows
    (prefill_attention.py, also over cold blocks); prefill over windows: the portable path."""
    has_cold_blocks = cold is not None and getattr(meta, "block_kinds", None) is not None
    if meta.max_query_len != 1:
        if meta.sliding_window is not None:
            return paged_attention(q, k_cache, v_cache, meta, scale, cold=cold)
        return _mixed_step(q, k_cache, v_cache, meta, scale, cold=cold if has_cold_blocks else None)
    splits = choose_num_splits(meta.num_seqs, k_cache.shape[2], meta.max_context_len)
    if has_cold_blocks and getattr(meta, "cold_prefix_blocks", None) is not None:
        from .triton_cold_prefix_attention import cold_prefix_decode_attention

        tables = meta.block_tables.to(torch.int32).contiguous()
        return cold_prefix_decode_attention(q, k_cache, v_cache, cold, tables,
                                            meta.block_slots.to(torch.int32).contiguous(), meta.cold_prefix_blocks,
                                            meta.cold_prefix_kind, meta.context_lens, scale, splits,
                                            meta.sliding_window)
    if has_cold_blocks:
        from .triton_cold_attention import cold_paged_decode_attention

        return cold_paged_decode_attention(q, k_cache, v_cache, cold, meta.block_tables, meta.block_kinds,
                                           meta.block_slots, meta.context_lens, scale, splits, meta.sliding_window)
    return paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale,
                                  splits, meta.sliding_window)


triton_paged_attention.supports_cold_kv = True
