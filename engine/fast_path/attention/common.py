"""What the decode attention kernels share: the split of a sequence's keys, the GQA
query group, the K/V tile loader, the online-softmax update and the in-kernel merge of
the splits (Triton helpers), and the host-side split count and buffers.

The scheme (flash-decoding over the block tables): one program per (sequence, KV
head, split) loads the whole GQA group of query heads sharing the KV head, padded to
16 rows for the tensor-core dot, so each K/V block is read once per step, not once
per query head. A sequence's keys are cut into `num_splits` tile-aligned ranges
computed from its own length inside the kernel (no host knowledge of lengths, so a
captured CUDA graph stays valid for any context); each split stores its normalised
partial output and log-sum-exp, and the last split of a (sequence, KV head) to finish
merges them (a counter per pair; at batch 1 a second merge launch cost 3.8 us a layer).
Rows of context length 0 (padded rows of a CUDA-graph batch) get zeros, never NaN.
A head dimension that is not a power of two (80, 96) is padded to one inside the
kernels (`tl.arange` needs powers of two): the padding lanes load zeros and store
nothing, so the dots and sums are those of the real dimensions.
"""
from __future__ import annotations

import torch

from ..availability import has_triton
from ..launch_shape import next_power_of_2

TILE_TOKENS = 64  # keys per inner iteration (several KV blocks)
MAX_SPLITS = 64
TARGET_PROGRAMS = 2 * 132  # two waves' worth on an H200's 132 SMs
INT8, INT4 = 1, 2  # cold kind codes, as in engine/kv/block_pool.py KIND_CODE
# Float32 elements of partial outputs the merging program holds at once: 16 splits of a
# GQA-4 group at head dim 128, as the decode kernel always had. A fixed 16 splits a round
# held 16 x 16 x 128 for the chunk rows' 16-query packs: on the H200 that kernel took 255
# registers a thread and spilled at 4 warps (164, no spills, with this tile), and 32 rows
# after a 2,080-token prefix took 24.7 against 23.5 us a layer; 64-query packs at 128 rows
# 39.1 against 34.7 (bench/attention_sweep.py --merge-tiles 8192,32768).
MERGE_TILE_ELEMENTS = 8192

if has_triton():
    import triton
    import triton.language as tl

    @triton.jit
    def split_bounds(ctx_ptr, b, split, window, NUM_SPLITS: tl.constexpr, TILE: tl.constexpr):
        """(context length, first key, end) of this program's split: the sequence's keys
        (the last `window` of them with a sliding window) cut into tile-aligned parts."""
        ctx = tl.load(ctx_ptr + b).to(tl.int32)
        first = tl.where(window > 0, tl.maximum(ctx - window, 0), 0)
        per_split = tl.cdiv(tl.cdiv(ctx - first, NUM_SPLITS), TILE) * TILE
        lo = first + split * per_split
        return ctx, lo, tl.minimum(lo + per_split, ctx)

    @triton.jit
    def splits_with_keys(ctx, window, NUM_SPLITS: tl.constexpr, TILE: tl.constexpr):
        """How many of the sequence's leading splits (split_bounds) hold keys; at least 1,
        so that a sequence without keys still gets its (zero) output from split 0. The
        graphs fix NUM_SPLITS for the longest context, so at short ones most splits are
        empty (a batch-1 step at context 640 fills 10 of 64) and the merge skips them."""
        first = tl.where(window > 0, tl.maximum(ctx - window, 0), 0)
        per_split = tl.cdiv(tl.cdiv(ctx - first, NUM_SPLITS), TILE) * TILE
        return tl.maximum(tl.cdiv(ctx - first, tl.maximum(per_split, 1)), 1)

    @triton.jit
    def head_lanes(HEAD_DIM: tl.constexpr):
        """The lanes of a head vector: HEAD_DIM up to a power of two."""
        return tl.arange(0, triton.next_power_of_2(HEAD_DIM))

    @triton.jit
    def lane_mask(rows_ok, d, HEAD_DIM: tl.constexpr):
        """rows_ok [rows] as a [rows, lanes] mask, without the padding lanes (head_lanes)."""
        if triton.next_power_of_2(HEAD_DIM) == HEAD_DIM:
            mask = rows_ok[:, None]
        else:
            mask = rows_ok[:, None] & (d < HEAD_DIM)[None, :]
        return mask

    @triton.jit
    def group_queries(q_ptr, b, kvh, stride_qb, stride_qh,
                      GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr):
        """The query heads sharing KV head `kvh`, padded to GROUP_PAD rows of zeros."""
        g = tl.arange(0, GROUP_PAD)
        d = head_lanes(HEAD_DIM)
        heads = kvh * GROUP + g
        is_head = g < GROUP
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                    mask=lane_mask(is_head, d, HEAD_DIM), other=0.0)
        return q, heads, is_head, d

    @triton.jit
    def load_codes(data_ptr, base, mask, d, d2, KIND: tl.constexpr, HEAD_DIM: tl.constexpr = 0):
        """One tile of keys or values as stored: [TILE, HEAD_DIM] hot values (KIND 0) or
        int8 codes (1), [TILE, HEAD_DIM / 2] packed int4 bytes (2); `base` [TILE] is each
        token's offset. mask None: unmasked (the caller makes every address valid).
        HEAD_DIM (hot values): the real head dim when `d` holds padding lanes (head_lanes),
        which then load zeros; 0: every lane of `d` is real.
        (Branches, not early returns: Triton compiles the statements after a return.)"""
        if KIND == 2:
            ptrs = data_ptr + base[:, None] + d2[None, :]
        else:
            ptrs = data_ptr + base[:, None] + d[None, :]
        if mask is None:
            x = tl.load(ptrs)
        elif KIND == 0 and HEAD_DIM > 0:
            x = tl.load(ptrs, mask=lane_mask(mask, d, HEAD_DIM), other=0.0)
        elif KIND == 0:
            x = tl.load(ptrs, mask=mask[:, None], other=0.0)
        elif KIND == 1:
            x = tl.load(ptrs, mask=mask[:, None], other=0)
        else:
            x = tl.load(ptrs, mask=mask[:, None], other=0x88)  # code 0 in both nibbles
        return x

    @triton.jit
    def load_tile(data_ptr, scale_ptr, base, scale_base, mask, d, d2,
                  KIND: tl.constexpr, HEAD_DIM: tl.constexpr, GROUP4: tl.constexpr, DTYPE: tl.constexpr):
        """One tile of keys or values in DTYPE, not yet scaled, and a per-token scale [TILE]
        for the scores (keys) or probabilities (values): the integer codes are exact in
        bf16/fp16, so the dot products run on them directly and dequantizing costs no
        per-element multiply. Hot tokens (KIND 0) and int4 groups smaller than the head
        dimension (scaled per element here) get scale 1."""
        codes = load_codes(data_ptr, base, mask, d, d2, KIND)
        token_scale = tl.full(base.shape, 1.0, tl.float32)
        if KIND == 0:
            x = codes.to(DTYPE)
        elif KIND == 1:
            x = codes.to(DTYPE)
            token_scale = tl.load(scale_ptr + scale_base, mask=mask, other=1.0).to(tl.float32)
        else:
            packed = codes.to(tl.int32)
            unpacked = tl.interleave((packed & 0xF) - 8, (packed >> 4) - 8)  # even dims low nibble, odd high
            if GROUP4 == HEAD_DIM:
                x = unpacked.to(DTYPE)
                token_scale = tl.load(scale_ptr + scale_base, mask=mask, other=1.0).to(tl.float32)
            else:
                s = tl.load(scale_ptr + scale_base[:, None] + (d // GROUP4)[None, :], mask=mask[:, None], other=0.0)
                x = (unpacked.to(tl.float32) * s.to(tl.float32)).to(DTYPE)
        return x, token_scale

    @triton.jit
    def exp2_approx(x, PTX: tl.constexpr):
        """2 ** x. On the GPU the bare ex2.approx.ftz: Triton's exp2 and exp add, per
        element, a test for subnormal results with a predicated halving and squaring
        (and exp a multiply by log2(e)), which at 16 to 17 exponentials per thread per
        tile is about 60 instructions; subnormal probabilities flush to zero instead."""
        if PTX:
            return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                             is_pure=True, pack=1)
        return tl.exp2(x)

    @triton.jit
    def online_softmax(s, v, v_scale, m_i, l_i, acc, BASE2: tl.constexpr = False, PTX: tl.constexpr = False):
        """One tile of online softmax. s [rows, tile]: the tile's scaled scores, -inf past
        the keys (in base 2 with BASE2: then m_i is too). v [tile, dim]; v_scale [tile]
        multiplies the probabilities (how cold values dequantize), None for none. l_i:
        running row sums [rows], or [rows, tile] per-element sums for the caller to add up
        after the loop (a row sum per tile crosses the warps, which hold different keys,
        through shared memory and barriers, on the path to the next tile)."""
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if BASE2:
            p = exp2_approx(s - m_new[:, None], PTX)
            alpha = exp2_approx(m_i - m_new, PTX)
        else:
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
        if len(l_i.shape) == 2:
            l_i = l_i * alpha[:, None] + p
        else:
            l_i = l_i * alpha + tl.sum(p, 1)
        if v_scale is not None:
            p = p * v_scale[None, :]
        return m_new, l_i, tl.dot(p.to(v.dtype), v, acc * alpha[:, None])

    @triton.jit
    def hot_run(q, k_ptr, v_ptr, tables_ptr, b, kvh, lo, hi, m_i, l_i, acc, scale, d,
                stride_tb, stride_kb, stride_kt, stride_kh, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
                row_ctx=None, PREFETCH: tl.constexpr = False, HEAD_DIM: tl.constexpr = 0):
        """Keys lo..hi of sequence b from hot (bf16/fp16) blocks into the softmax state.
        row_ctx [rows]: each query row sees only keys below its own limit (chunk_rows.py).
        PREFETCH: load the next tile's block-table entries and this tile's values with its
        keys, so that a tile's K/V loads do not wait on its table load (for long loops).
        HEAD_DIM: the real head dim when `d` holds padding lanes (load_codes)."""
        table = tables_ptr + b * stride_tb
        if PREFETCH:
            first = lo + tl.arange(0, TILE)
            page = tl.load(table + first // BLOCK_SIZE, mask=first < hi, other=0)
        for start in range(lo, hi, TILE):
            t = start + tl.arange(0, TILE)
            in_range = t < hi
            if not PREFETCH:
                page = tl.load(table + t // BLOCK_SIZE, mask=in_range, other=0)
            offs = page.to(tl.int64) * stride_kb + (t % BLOCK_SIZE) * stride_kt + kvh * stride_kh
            k = load_codes(k_ptr, offs, in_range, d, d, 0, HEAD_DIM)
            if PREFETCH:
                v = load_codes(v_ptr, offs, in_range, d, d, 0, HEAD_DIM)
                page = tl.load(table + (t + TILE) // BLOCK_SIZE, mask=t + TILE < hi, other=0)
            visible = in_range[None, :]
            if row_ctx is not None:
                visible = visible & (t[None, :] < row_ctx[:, None])
            s = tl.where(visible, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
            if not PREFETCH:
                v = load_codes(v_ptr, offs, in_range, d, d, 0, HEAD_DIM)
            m_i, l_i, acc = online_softmax(s, v, None, m_i, l_i, acc)
        return m_i, l_i, acc

    @triton.jit
    def merge_group(part_ptr, lse_ptr, out_ptr, b, kvh, used, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                    stride_ob, stride_oh, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, MERGE_TILE: tl.constexpr):
        """The outputs of KV head kvh's GROUP query heads from their first `used` splits,
        all heads at once (one round of loads per SPLIT_CHUNK splits, not one per head),
        with a running maximum of the log-sum-exps across chunks. A round's partial
        outputs are one [GROUP, SPLIT_CHUNK, HEAD_DIM] float32 tile of MERGE_TILE elements."""
        GROUP_P2: tl.constexpr = triton.next_power_of_2(GROUP)
        SPLIT_CHUNK: tl.constexpr = MERGE_TILE // (GROUP_P2 * triton.next_power_of_2(HEAD_DIM))
        tl.static_assert(SPLIT_CHUNK >= 1, "a merge round must hold at least one split of every head")
        g = tl.arange(0, GROUP_P2)
        is_head = g < GROUP
        heads = kvh * GROUP + g
        d = head_lanes(HEAD_DIM)
        d_ok = d < HEAD_DIM
        top = tl.full([GROUP_P2], float("-inf"), tl.float32)
        total = tl.zeros([GROUP_P2], tl.float32)
        acc = tl.zeros([GROUP_P2, triton.next_power_of_2(HEAD_DIM)], tl.float32)
        for c0 in range(0, used, SPLIT_CHUNK):
            sp = c0 + tl.arange(0, SPLIT_CHUNK)
            valid = is_head[:, None] & (sp < used)[None, :]
            # .cg: the splits were written by other programs, possibly on other SMs (L1 is not coherent)
            lse = tl.load(lse_ptr + b * stride_lb + heads[:, None] * stride_lh + sp[None, :], mask=valid,
                          other=float("-inf"), cache_modifier=".cg")
            parts = tl.load(part_ptr + b * stride_pb + heads[:, None, None] * stride_ph + sp[None, :, None] * stride_ps
                            + d[None, None, :], mask=valid[:, :, None] & d_ok[None, None, :], other=0.0,
                            cache_modifier=".cg")
            new_top = tl.maximum(top, tl.max(lse, 1))
            safe_top = tl.where(new_top == float("-inf"), 0.0, new_top)
            weight = tl.exp(lse - safe_top[:, None])
            rescale = tl.exp(top - safe_top)
            total = total * rescale + tl.sum(weight, 1)
            acc = acc * rescale[:, None] + tl.sum(parts * weight[:, :, None], 1)
            top = new_top
        merged = acc / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :], merged.to(out_ptr.dtype.element_ty),
                 mask=lane_mask(is_head, d, HEAD_DIM))

    @triton.jit
    def finish_split(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, done_ptr, b, kvh, heads, is_head, d, split, used,
                     stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                     GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
                     MERGE_TILE: tl.constexpr = MERGE_TILE_ELEMENTS):
        """Store the split's normalised partial output and log-sum-exp (unsplit: the
        output itself); the last of the `used` splits of (b, kvh) to finish merges the
        group's heads and re-arms the counter for the next launch (and graph replay)."""
        has_keys = l_i > 0
        safe_l = tl.where(has_keys, l_i, 1.0)
        part = acc / safe_l[:, None]
        if NUM_SPLITS == 1:
            tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                     part.to(out_ptr.dtype.element_ty), mask=lane_mask(is_head, d, HEAD_DIM))
        else:
            tl.store(part_ptr + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps + d[None, :],
                     part, mask=lane_mask(is_head, d, HEAD_DIM))
            lse = tl.where(has_keys, m_i + tl.log(safe_l), float("-inf"))
            tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=is_head)
            if split < used:
                tl.debug_barrier()  # every thread's partial stores before the release below
                counter = done_ptr + b * tl.num_programs(1) + kvh
                if tl.atomic_add(counter, 1, sem="acq_rel") == used - 1:
                    merge_group(part_ptr, lse_ptr, out_ptr, b, kvh, used, stride_pb, stride_ph, stride_ps,
                                stride_lb, stride_lh, stride_ob, stride_oh, GROUP, HEAD_DIM, MERGE_TILE)
                    tl.atomic_xchg(counter, 0)


def check_num_splits(num_splits: int) -> None:
    if num_splits < 1 or num_splits & (num_splits - 1):
        raise ValueError(f"num_splits must be a power of two, got {num_splits}")


def choose_num_splits(batch: int, num_kv_heads: int, max_context_len: int,
                      target_programs: int = TARGET_PROGRAMS) -> int:
    """Power of two: enough programs to fill the GPU, but no split shorter than one tile."""
    splits = 1
    while (batch * num_kv_heads * splits < target_programs and splits < MAX_SPLITS
           and splits * 2 * TILE_TOKENS <= max_context_len):
        splits *= 2
    return splits


def cold_kernels_take(head_dim: int) -> bool:
    """Whether the cold-block kernels (cold_prefix.py, mixed_cold.py) run at this head dim:
    powers of two only (their int4 and integer-dot loops are not padded). Elsewhere,
    attention over cold blocks takes the portable kernel (triton_paged_attention)."""
    return head_dim > 0 and head_dim & (head_dim - 1) == 0


def group_pad(heads: int, kv_heads: int) -> int:
    """Rows of the dot products: the GQA group padded to a power of two of at least 16."""
    return max(16, next_power_of_2(heads // kv_heads))


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


def split_strides(q: torch.Tensor, part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor,
                  num_splits: int) -> tuple[int, ...]:
    """(stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh)."""
    return (part.stride(0), part.stride(1), part.stride(2) if num_splits > 1 else 0,
            lse.stride(0), lse.stride(1), out.stride(0), out.stride(1))
