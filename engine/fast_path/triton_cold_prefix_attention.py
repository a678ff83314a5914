"""Paged decode attention for the usual cold layout: cold blocks first, then hot ones.

Same flash-decoding scheme and merge as triton_attention.py, but each sequence's
context is two runs (cold_layout.py): its leading `cold_blocks[b]` blocks are all of
one cold kind (int8, or int4 packed two per byte), the rest are hot. A split loops
over its share of the cold run and then over its share of the hot run. Each loop has
one kind of load and no decision per tile, so Triton can pipeline it like the hot
kernel, and an int8 tile costs half the bytes of a hot one (int4: a quarter).

As in triton_cold_attention.py the integer codes go into the dot products as they are
(exact in bf16/fp16) and each token's scale multiplies its scores (keys) or its
probabilities (values); int4 with several scale groups per head is scaled per element.

The fast loop (int8, and int4 with one scale per head) is shaped by what the H200 showed
(BENCHMARKS.md, issue 9, sessions 6-7): each tile's table entries and scales are read two tiles ahead, so no iteration waits on a
table read and then on the copies it addresses; scores in base 2 with a bare ex2 and
unmasked K/V loads cut instructions; the value codes are converted to fp16 where they are
loaded (not as single-byte shared loads in the dot's layout), and the probabilities' row
sums wait until after the loop, which leaves the loop bound by shared-memory latency. The
last split of each (sequence, KV head) to finish merges the splits, as in the hot kernel.
"""
from __future__ import annotations

import torch

from .availability import has_triton
from .triton_attention import TILE_TOKENS, split_buffers, split_counters

INT8, INT4 = 1, 2  # kind codes, as in engine.kv_cache.KIND_CODE
# How int8 tiles enter the dot products (COLD_DOTS). Converting int8 codes to bf16 costs
# about 2.5 instructions per code (the H200's int8 kernel was bound by instruction issue,
# not by memory: 1,599 instructions per 64-token tile against the hot loop's 672, read in
# the SASS compiled offline), so:
#   0: codes converted to q's dtype (the reference; the only one in float32),
#   1: codes to fp16 by bit arithmetic (the code's byte under an fp16 exponent, one
#      subtraction), q and probabilities in fp16,
#   2: keys not converted at all: q quantized to int8 per head, scores from an int8 dot
#      (int32 accumulation) times both scales; values as in 1.
# int4 with one scale per head takes fp16 codes by bit arithmetic under 1 and 2.
DOTS_IN_DTYPE, DOTS_FP16, DOTS_INT8_KEYS = 0, 1, 2
DEFAULT_COLD_DOTS = DOTS_INT8_KEYS  # for bf16/fp16 queries; float32 always uses DOTS_IN_DTYPE
# Launch defaults per kind, (warps, stages, tables ahead): the best of the sweeps on the H200 at
# 32k x 8 (BENCHMARKS.md, sessions 6-7): three stages, table entries and scales read two tiles
# ahead, for both kinds since int4 runs the same fast loop (session 7; before it, int4 was
# bound by nibble unpacking and slower with either).
NUM_WARPS = 2
LAUNCH_DEFAULTS = {INT8: (NUM_WARPS, 3, 2), INT4: (NUM_WARPS, 3, 2)}
MIN_TILE = 32

if has_triton():
    import triton
    import triton.language as tl

    from .triton_attention import (_group_queries, _merge_group, _softmax_update,
                                   _split_bounds, _splits_with_keys,
                                   _store_split)

    @triton.jit
    def _load_cold(data_ptr, scale_ptr, base, scale_base, in_range, d, d2,
                   KIND: tl.constexpr, HEAD_DIM: tl.constexpr, GROUP4: tl.constexpr, DTYPE: tl.constexpr):
        """One tile's codes in DTYPE and its per-token scales (1 where int4 is scaled per element)."""
        if KIND == 1:
            x = tl.load(data_ptr + base[:, None] + d[None, :], mask=in_range[:, None], other=0).to(DTYPE)
            token_scale = tl.load(scale_ptr + scale_base, mask=in_range, other=1.0).to(tl.float32)
        else:
            packed = tl.load(data_ptr + base[:, None] + d2[None, :], mask=in_range[:, None], other=0x88).to(tl.int32)
            codes = tl.interleave((packed & 0xF) - 8, (packed >> 4) - 8)  # even dims low nibble, odd high
            if GROUP4 == HEAD_DIM:
                x = codes.to(DTYPE)
                token_scale = tl.load(scale_ptr + scale_base, mask=in_range, other=1.0).to(tl.float32)
            else:
                s = tl.load(scale_ptr + scale_base[:, None] + (d // GROUP4)[None, :], mask=in_range[:, None], other=0.0)
                x = (codes.to(tl.float32) * s.to(tl.float32)).to(DTYPE)
                token_scale = tl.full(in_range.shape, 1.0, tl.float32)
        return x, token_scale

    @triton.jit
    def _cold_entries(tables_ptr, slots_ptr, b, t, end, stride_tb, BLOCK_SIZE: tl.constexpr):
        """(page, slot) of the blocks holding tokens `t` (zeros past `end`)."""
        entry = b * stride_tb + t // BLOCK_SIZE
        page = tl.load(tables_ptr + entry, mask=t < end, other=0).to(tl.int64)
        slot = tl.load(slots_ptr + entry, mask=t < end, other=0)
        return page, slot

    @triton.jit
    def _cold_scales(cks_ptr, cvs_ptr, page, slot, t, kvh, stride_sp, stride_ss, stride_st, stride_sh,
                     BLOCK_SIZE: tl.constexpr):
        """Key and value scales (float32) of tokens `t`, whose blocks are at (page, slot)."""
        scale_base = page * stride_sp + slot * stride_ss + (t % BLOCK_SIZE) * stride_st + kvh * stride_sh
        return tl.load(cks_ptr + scale_base).to(tl.float32), tl.load(cvs_ptr + scale_base).to(tl.float32)

    @triton.jit
    def _recomputed(x):
        """x (table entries or scales, all >= 0; NaN kept) computed again rather than passed
        on: Triton's pipeliner leaves a loop alone when a loop-carried value is passed on
        unchanged (a dependence two iterations deep)."""
        return tl.maximum(x, 0, propagate_nan=tl.PropagateNan.ALL)

    @triton.jit
    def _int8_to_fp16(x):
        """Exact fp16 of int8 codes without conversion instructions: code + 128 as the low
        byte under fp16's exponent byte 0x64 is the fp16 1024 + 128 + code."""
        return (x.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True) - 1152.0

    @triton.jit
    def _int8_values_to_fp16(x, PTX: tl.constexpr):
        """_int8_to_fp16 for the P.V operand, done where the codes were loaded. Triton moves
        a pure conversion of a dot operand behind its change to the dot's layout, and for
        int8 values that change is a transpose: single-byte shared loads, one per code (int8
        has no transposing ldmatrix; ~290 of the int8 loop's 914 instructions a tile, offline
        SASS). Not marked pure, this conversion stays put: 16-byte shared loads, the codes
        converted four at a time, and fp16 goes through shared memory to ldmatrix.trans."""
        if PTX:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 r, c; xor.b32 r, $2, 0x80808080; mov.b32 c, 0x64806480;"
                " prmt.b32 $0, r, 0x64646464, 0x5140; prmt.b32 $1, r, 0x64646464, 0x7362;"
                " sub.f16x2 $0, $0, c; sub.f16x2 $1, $1, c; }",
                "=r,=r,r", [x], dtype=tl.float16, is_pure=False, pack=4)
        return _int8_to_fp16(x)

    @triton.jit
    def _int4_to_fp16(x):
        """Exact fp16 of packed int4 codes (two a byte, even dims in the low nibble, stored
        as code + 8): the nibble under fp16's exponent byte 0x64 is 1024 + 8 + code."""
        x = x.to(tl.int32)
        return (tl.interleave(x & 0xF, x >> 4) | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - 1032.0

    @triton.jit
    def _int4_values_to_fp16(x, PTX: tl.constexpr):
        """_int4_to_fp16 for the P.V operand, converted where loaded (as _int8_values_to_fp16):
        each byte's low nibbles and high nibbles as two fp16 tensors, interleaved."""
        if PTX:
            low, high = tl.inline_asm_elementwise(
                "{ .reg .b32 l, h, c; and.b32 l, $4, 0x0F0F0F0F; shr.b32 h, $4, 4; and.b32 h, h, 0x0F0F0F0F;"
                " mov.b32 c, 0x64086408;"
                " prmt.b32 $0, l, 0x64646464, 0x5140; prmt.b32 $1, l, 0x64646464, 0x7362;"
                " prmt.b32 $2, h, 0x64646464, 0x5140; prmt.b32 $3, h, 0x64646464, 0x7362;"
                " sub.f16x2 $0, $0, c; sub.f16x2 $1, $1, c; sub.f16x2 $2, $2, c; sub.f16x2 $3, $3, c; }",
                "=r,=r,=r,=r,r", [x], dtype=(tl.float16, tl.float16), is_pure=False, pack=4)
            return tl.interleave(low, high)
        return _int4_to_fp16(x)

    _LOG2E = tl.constexpr(1.4426950408889634)
    _LN2 = tl.constexpr(0.6931471805599453)

    @triton.jit
    def _exp2(x, PTX: tl.constexpr):
        """2 ** x. On the GPU the bare ex2.approx.ftz: Triton's exp2 and exp add, per
        element, a test for subnormal results with a predicated halving and squaring
        (and exp a multiply by log2(e)), which at 16 to 17 exponentials per thread per
        tile is about 60 instructions; subnormal probabilities flush to zero instead."""
        if PTX:
            return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                             is_pure=True, pack=1)
        return tl.exp2(x)

    @triton.jit
    def _softmax_update_log2(s, v, v_scale, m_i, l_tile, acc, PTX: tl.constexpr):
        """_softmax_update_scores for scores already multiplied by log2(e) and masked (-inf
        past the keys): the running maximum is in base 2 too. The probabilities' row sums
        are kept per element in `l_tile` ([rows, tile]) and summed once after the loop:
        a row sum per tile crosses the two warps, which hold different keys, through
        shared memory and barriers, on the path to the next tile."""
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = _exp2(s - m_new[:, None], PTX)
        alpha = _exp2(m_i - m_new, PTX)[:, None]
        l_tile = l_tile * alpha + p
        acc = tl.dot((p * v_scale[None, :]).to(v.dtype), v, acc * alpha)
        return m_new, l_tile, acc

    @triton.jit
    def _quantize_rows_int8(q):
        """q [rows, dim] as int8 codes with a scale per row (symmetric, round half away)."""
        qf = q.to(tl.float32)
        q_scale = tl.max(tl.abs(qf), 1) / 127.0
        q_scale = tl.where(q_scale > 0, q_scale, 1.0)
        x = qf / q_scale[:, None]
        return tl.where(x >= 0, x + 0.5, x - 0.5).to(tl.int8), q_scale

    @triton.jit
    def _cold_prefix_split_kernel(
        q_ptr, k_ptr, v_ptr, tables_ptr, slots_ptr, cold_blocks_ptr, ctx_ptr, part_ptr, lse_ptr, out_ptr, done_ptr,
        ck_ptr, cv_ptr, cks_ptr, cvs_ptr,
        scale, window,
        stride_qb, stride_qh,
        stride_hb, stride_ht, stride_hh,
        stride_tb,
        stride_cp, stride_cs, stride_ct, stride_ch,
        stride_sp, stride_ss, stride_st, stride_sh,
        stride_pb, stride_ph, stride_ps,
        stride_lb, stride_lh,
        stride_ob, stride_oh,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr,
        KIND: tl.constexpr, GROUP4: tl.constexpr, COLD_DOTS: tl.constexpr, TABLES_AHEAD: tl.constexpr,
        PTX: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        ctx, lo, hi = _split_bounds(ctx_ptr, b, split, window, NUM_SPLITS, TILE)
        cold_end = tl.minimum(tl.load(cold_blocks_ptr + b).to(tl.int32) * BLOCK_SIZE, ctx)
        q, heads, is_head, d = _group_queries(q_ptr, b, kvh, stride_qb, stride_qh, GROUP, GROUP_PAD, HEAD_DIM)
        d2 = tl.arange(0, HEAD_DIM // 2)
        dtype = q_ptr.dtype.element_ty

        m_i = tl.full([GROUP_PAD], -1e30, tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        cold_hi = tl.minimum(hi, cold_end)
        # The fast loop: int8 under cold_dots 1 and 2, int4 with one scale per head under both.
        FAST: tl.constexpr = COLD_DOTS != 0 and (KIND == 1 or GROUP4 == HEAD_DIM)
        if FAST:
            q16 = q.to(tl.float16)
        if KIND == 1 and COLD_DOTS == 2:
            q8, q_scale = _quantize_rows_int8(q)
            q_scale2 = q_scale * (scale * _LOG2E)
        if FAST:
            l_tile = tl.zeros([GROUP_PAD, TILE], tl.float32)
        # TABLES_AHEAD (0, 2 or 3): each tile's (page, slot) entries are loaded that many tiles
        # before it. Triton's pipeliner issues a tile's K/V copies num_stages - 1 iterations
        # early; with the entries loaded in that same iteration, every copy waits on a
        # dependent global read (table, then data). The fast loop reads its scales ahead
        # with the entries too: pipelined, an int8 tile's 64 scale copies (one per token,
        # from one address per block) took 15 times the shared-memory wavefronts of distinct
        # addresses (ncu), about 9 us of 155 at 32k x 8.
        SCALES_AHEAD: tl.constexpr = TABLES_AHEAD != 0 and FAST
        if TABLES_AHEAD:
            t_c = lo + tl.arange(0, TILE)
            page_c, slot_c = _cold_entries(tables_ptr, slots_ptr, b, t_c, cold_hi, stride_tb, BLOCK_SIZE)
            page_n, slot_n = _cold_entries(tables_ptr, slots_ptr, b, t_c + TILE, cold_hi, stride_tb, BLOCK_SIZE)
            if SCALES_AHEAD:
                k_scale_c, v_scale_c = _cold_scales(cks_ptr, cvs_ptr, page_c, slot_c, t_c, kvh,
                                                    stride_sp, stride_ss, stride_st, stride_sh, BLOCK_SIZE)
                k_scale_n, v_scale_n = _cold_scales(cks_ptr, cvs_ptr, page_n, slot_n, t_c + TILE, kvh,
                                                    stride_sp, stride_ss, stride_st, stride_sh, BLOCK_SIZE)
        if TABLES_AHEAD == 3:
            page_nn, slot_nn = _cold_entries(tables_ptr, slots_ptr, b, t_c + 2 * TILE, cold_hi, stride_tb, BLOCK_SIZE)
            if SCALES_AHEAD:
                k_scale_nn, v_scale_nn = _cold_scales(cks_ptr, cvs_ptr, page_nn, slot_nn, t_c + 2 * TILE, kvh,
                                                      stride_sp, stride_ss, stride_st, stride_sh, BLOCK_SIZE)
        for start in range(lo, cold_hi, TILE):
            t = start + tl.arange(0, TILE)
            in_range = t < cold_hi
            tok = t % BLOCK_SIZE
            if TABLES_AHEAD:
                page, slot = page_c, slot_c
                page_a, slot_a = _cold_entries(tables_ptr, slots_ptr, b, t + TABLES_AHEAD * TILE, cold_hi, stride_tb,
                                               BLOCK_SIZE)
                page_c, slot_c = _recomputed(page_n), _recomputed(slot_n)
                if SCALES_AHEAD:
                    k_scale, v_scale_raw = k_scale_c, v_scale_c
                    k_scale_a, v_scale_a = _cold_scales(cks_ptr, cvs_ptr, page_a, slot_a, t + TABLES_AHEAD * TILE, kvh,
                                                        stride_sp, stride_ss, stride_st, stride_sh, BLOCK_SIZE)
                    k_scale_c, v_scale_c = _recomputed(k_scale_n), _recomputed(v_scale_n)
                if TABLES_AHEAD == 3:
                    page_n, slot_n = _recomputed(page_nn), _recomputed(slot_nn)
                    page_nn, slot_nn = page_a, slot_a
                    if SCALES_AHEAD:
                        k_scale_n, v_scale_n = _recomputed(k_scale_nn), _recomputed(v_scale_nn)
                        k_scale_nn, v_scale_nn = k_scale_a, v_scale_a
                else:
                    page_n, slot_n = page_a, slot_a
                    if SCALES_AHEAD:
                        k_scale_n, v_scale_n = k_scale_a, v_scale_a
            else:
                page, slot = _cold_entries(tables_ptr, slots_ptr, b, t, cold_hi, stride_tb, BLOCK_SIZE)
            base = page * stride_cp + slot * stride_cs + tok * stride_ct + kvh * stride_ch
            if FAST:
                # Unmasked: tokens past the run read page 0's slot 0 (their table entries load
                # as zeros), real and finite codes whose scores are masked below and whose zero
                # probabilities cancel them (the masks cost ~150 instructions a tile, offline
                # SASS). Only a value scale there could be inf or nan, which a zero probability
                # would not cancel: it is selected after the load.
                if KIND == 1:
                    k8 = tl.load(ck_ptr + base[:, None] + d[None, :])
                    v8 = tl.load(cv_ptr + base[:, None] + d[None, :])
                else:  # two codes a byte
                    k4 = tl.load(ck_ptr + base[:, None] + d2[None, :])
                    v4 = tl.load(cv_ptr + base[:, None] + d2[None, :])
                if not SCALES_AHEAD:
                    k_scale, v_scale_raw = _cold_scales(cks_ptr, cvs_ptr, page, slot, t, kvh,
                                                        stride_sp, stride_ss, stride_st, stride_sh, BLOCK_SIZE)
                v_scale = tl.where(in_range, v_scale_raw, 1.0)
                # Scores in base 2 (exponentials by a bare ex2, _exp2), masked by adding -inf
                # past the keys in the same fused multiply-add that scales them.
                bias = tl.where(in_range, 0.0, float("-inf"))
                if KIND == 2:
                    s = tl.dot(q16, tl.trans(_int4_to_fp16(k4)))
                    s = tl.fma(s, (k_scale * (scale * _LOG2E))[None, :], bias[None, :])
                    v16 = _int4_values_to_fp16(v4, PTX)
                else:
                    if COLD_DOTS == 1:
                        s = tl.dot(q16, tl.trans(_int8_to_fp16(k8)))
                        s = tl.fma(s, (k_scale * (scale * _LOG2E))[None, :], bias[None, :])
                    else:
                        s = tl.dot(q8, tl.trans(k8), out_dtype=tl.int32).to(tl.float32)
                        s = tl.fma(s * q_scale2[:, None], k_scale[None, :], bias[None, :])
                    v16 = _int8_values_to_fp16(v8, PTX)
                m_i, l_tile, acc = _softmax_update_log2(s, v16, v_scale, m_i, l_tile, acc, PTX)
            else:
                scale_base = page * stride_sp + slot * stride_ss + tok * stride_st + kvh * stride_sh
                k, k_scale = _load_cold(ck_ptr, cks_ptr, base, scale_base, in_range, d, d2, KIND, HEAD_DIM, GROUP4,
                                        dtype)
                v, v_scale = _load_cold(cv_ptr, cvs_ptr, base, scale_base, in_range, d, d2, KIND, HEAD_DIM, GROUP4,
                                        dtype)
                m_i, l_i, acc = _softmax_update(q, k, v, k_scale, v_scale, in_range, m_i, l_i, acc, scale)

        if FAST:
            l_i = tl.sum(l_tile, 1)
            m_i = m_i * _LN2  # the cold loop's running maximum back to base e for the hot loop and the merge
        ones = tl.full([TILE], 1.0, tl.float32)
        # q read again for the hot loop: its shared-memory copy for the dot would otherwise be
        # live through the cold loop, and those 4 KB decide whether four programs fit an SM.
        q, heads, is_head, d = _group_queries(q_ptr, b, kvh, stride_qb, stride_qh, GROUP, GROUP_PAD, HEAD_DIM)
        for start in range(tl.maximum(lo, cold_end), hi, TILE):
            t = start + tl.arange(0, TILE)
            in_range = t < hi
            page = tl.load(tables_ptr + b * stride_tb + t // BLOCK_SIZE, mask=in_range, other=0).to(tl.int64)
            offs = page * stride_hb + (t % BLOCK_SIZE) * stride_ht + kvh * stride_hh
            k = tl.load(k_ptr + offs[:, None] + d[None, :], mask=in_range[:, None], other=0.0)
            v = tl.load(v_ptr + offs[:, None] + d[None, :], mask=in_range[:, None], other=0.0)
            m_i, l_i, acc = _softmax_update(q, k, v, ones, ones, in_range, m_i, l_i, acc, scale)

        _store_split(acc, m_i, l_i, part_ptr, lse_ptr, out_ptr, b, heads, is_head, d, split,
                     stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh, NUM_SPLITS)
        used = _splits_with_keys(ctx, window, NUM_SPLITS, TILE)
        if NUM_SPLITS > 1 and split < used:
            # As in the hot kernel (triton_attention.py): the last split of (b, kvh) to finish
            # merges the group's heads, with no second launch, and re-arms the counter.
            tl.debug_barrier()  # every thread's partial stores before the release below
            counter = done_ptr + b * tl.num_programs(1) + kvh
            if tl.atomic_add(counter, 1, sem="acq_rel") == used - 1:
                _merge_group(part_ptr, lse_ptr, out_ptr, b, kvh, used, stride_pb, stride_ph, stride_ps,
                             stride_lb, stride_lh, stride_ob, stride_oh, GROUP, HEAD_DIM)
                tl.atomic_xchg(counter, 0)


def cold_prefix_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cold,
                                 block_tables: torch.Tensor, block_slots: torch.Tensor, cold_blocks: torch.Tensor,
                                 kind: int, context_lens: torch.Tensor, scale: float, num_splits: int,
                                 sliding_window: int | None = None, num_warps: int | None = None,
                                 num_stages: int | None = None, tile: int = TILE_TOKENS,
                                 cold_dots: int | None = None, group_pad: int | None = None,
                                 tables_ahead: int | None = None) -> torch.Tensor:
    """One query token per sequence. Tables and slots are [B, max_blocks] (pages; the
    slot within the page for cold entries); `cold_blocks[b]` leading entries of row b
    are cold blocks of `kind` (1 int8, 2 int4), the rest hot; `cold` is the layer's
    kv_cache.ColdLayer. Returns [B, H, D] in q's dtype. `group_pad`: rows of the dot
    products, a power of two of at least 16 holding the GQA group (default the smallest;
    64 lets Triton use Hopper's warpgroup MMA with 4 warps). `tables_ahead`: read each cold
    tile's table entries 2 or 3 tiles before it (0: in the tile's own iteration). Warps,
    stages and tables ahead default per kind (LAUNCH_DEFAULTS)."""
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if kind not in (INT8, INT4):
        raise ValueError(f"kind must be {INT8} (int8) or {INT4} (int4), got {kind}")
    if num_splits < 1 or num_splits & (num_splits - 1):
        raise ValueError(f"num_splits must be a power of two, got {num_splits}")
    if tile < MIN_TILE or tile & (tile - 1):
        # At 16, int4 gave wrong outputs on the H200 (Triton 3.6; relative error 1.6) while
        # the interpreter agrees with the portable path: a code-generation problem, not
        # investigated; 16 was also the slowest tile for int8.
        raise ValueError(f"tile must be a power of two of at least {MIN_TILE}, got {tile}")
    default_warps, default_stages, default_ahead = LAUNCH_DEFAULTS[kind]
    num_warps = num_warps or default_warps
    num_stages = num_stages or default_stages
    tables_ahead = default_ahead if tables_ahead is None else tables_ahead
    if tables_ahead not in (0, 2, 3):
        raise ValueError(f"tables_ahead must be 0, 2 or 3, got {tables_ahead!r}")
    if block_slots.shape != block_tables.shape or block_slots.stride() != block_tables.stride():
        raise ValueError("block tables and slots must have the same shape and strides")
    if kind == INT8:
        data_k, data_v, scales_k, scales_v = cold.int8_k, cold.int8_v, cold.scales8_k, cold.scales8_v
    else:
        data_k, data_v, scales_k, scales_v = cold.int4_k, cold.int4_v, cold.scales4_k, cold.scales4_v
    if scales_k is None:
        raise ValueError(f"the KV cache has no {'int8' if kind == INT8 else 'int4'} blocks enabled")
    if kind == INT8:  # one scale per block and head: no token stride
        scale_strides = (scales_k.stride(0), scales_k.stride(1), 0, scales_k.stride(2))
        group4 = head_dim
    else:
        scale_strides = (scales_k.stride(0), scales_k.stride(1), scales_k.stride(2), scales_k.stride(3))
        group4 = head_dim // scales_k.shape[-1]
    if cold_dots is None:
        cold_dots = DEFAULT_COLD_DOTS if q.dtype != torch.float32 else DOTS_IN_DTYPE
    if cold_dots not in (DOTS_IN_DTYPE, DOTS_FP16, DOTS_INT8_KEYS):
        raise ValueError(f"cold_dots must be 0, 1 or 2, got {cold_dots!r}")
    group = heads // kv_heads
    smallest_pad = max(16, triton.next_power_of_2(group))
    group_pad = group_pad or smallest_pad
    if group_pad < smallest_pad or group_pad & (group_pad - 1):
        raise ValueError(f"group_pad must be a power of two of at least {smallest_pad}, got {group_pad}")
    out, part, lse = split_buffers(q, num_splits)
    _cold_prefix_split_kernel[(batch, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, block_slots, cold_blocks, context_lens, part, lse, out,
        split_counters(q.device, batch * kv_heads), data_k, data_v, scales_k, scales_v,
        scale, sliding_window or 0,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        data_k.stride(0), data_k.stride(1), data_k.stride(2), data_k.stride(3),
        *scale_strides,
        part.stride(0), part.stride(1), part.stride(2) if num_splits > 1 else 0,
        lse.stride(0), lse.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, TILE=tile, NUM_SPLITS=num_splits, KIND=kind, GROUP4=group4, COLD_DOTS=cold_dots,
        TABLES_AHEAD=tables_ahead,
        PTX=q.is_cuda and torch.version.hip is None, num_warps=num_warps, num_stages=num_stages,
    )
    return out
