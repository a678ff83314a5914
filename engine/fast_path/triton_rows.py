"""Products of a few rows (2-64 tokens) with the weights, with the small ops after them
fused in: the decode step of 2-64 rows shaped like batch 1's (triton_gemv.py).

A decode step of 2-64 rows still reads every weight once and does little arithmetic on
it. cuBLAS at those sizes reached 0.60-0.76 of the H200's copy rate on the attention
projections (the gate/up product, the largest, reaches 0.98), and SiLU-and-multiply and
the RoPE/K/V write are launches of their own. These kernels:

- `rows_gemm`: y = x W^T for x [M, K] (optionally SiLU(gate) * up of a fused gate/up
  weight as the epilogue).
- `rows_qkv_rope`: the fused q/k/v product with rotary embedding of q and k and every
  real row's K/V written into the paged cache as the epilogue.

One program computes BLOCK_N outputs of all M rows over the whole K, or over one of
`split_k` equal parts of it: its weight tile [BLOCK_N, BLOCK_K] times the rows' tile
[BLOCK_K, BLOCK_M] on tensor cores, the rows padded to BLOCK_M (at least 16, what a
dot needs; padded rows load zeros and store nothing). Split, each program stores its
fp32 partial products and the last of a tile's programs to finish (a counter per
tile, as the attention splits merge: attention/common.py) sums them in split order,
so the result does not depend on which finished last, and runs the epilogue (on the
H200 only the down product at 64 rows measured faster split: MEASURED_CONFIGS). The
loop only loads and multiplies, so Triton pipelines its loads: folding the RMSNorm into it, as the batch-1 GEMVs do, put elementwise work
between the loads and the dot and made the products 2-4x slower on the H200, so the
RMSNorm before each product stays fused_ops.add_rms_norm. SiLU-and-multiply and RoPE
round as fused_ops does.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .attention.common import split_counters
from .availability import has_triton
from .launch_shape import cdiv, check_launch_shape, next_power_of_2
from .pdl import pdl_launch

MAX_ROWS = 64
"""Most rows these kernels take (the largest BLOCK_M they are built for)."""
MIN_BLOCK = 16  # the smallest dot: BLOCK_M, BLOCK_N and PAIRS are at least this
ROW_COUNTS = (16, 32, 64)
"""The row tiles (BLOCK_M) the kernels are built for: 2-16 rows share the first."""


@dataclass(frozen=True, slots=True)
class RowsConfig:
    """Launch shape of one product: outputs per program, K per iteration, warps, stages."""

    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4
    split_k: int = 1  # programs per tile, each over an equal part of K

    def __post_init__(self):
        check_launch_shape(self.block_n, self.block_k, self.num_warps, self.num_stages, MIN_BLOCK)
        if self.split_k < 1 or self.split_k & (self.split_k - 1):
            raise ValueError(f"split_k must be a power of two, got {self.split_k}")


DEFAULT_CONFIG = RowsConfig()
_O_DOWN = RowsConfig(block_n=32, block_k=256, num_warps=4, num_stages=5)
MEASURED_CONFIGS: dict[tuple[int, int, int], RowsConfig | None] = {
    # The best of 30 launch shapes for llama3-8b-shape's products [N, K] at BLOCK_M 16 / 32 /
    # 64 on the H200 (engine/bench/rows_sweep.py; BENCHMARKS.md). None: cuBLAS was faster
    # (o at 64 rows: 0.53 of the copy rate against 0.61, and 0.60 split over K against 0.63);
    # other shapes take DEFAULT_CONFIG. Down at 64 rows, split over K in two, reached 0.81
    # against cuBLAS's 0.78 (unsplit: 0.65). Split, q/k/v lost 0.10-0.18 and o gained at most
    # 0.01, and down at 32 rows measured 0.78-0.88 whole in two sweeps against 0.86 split:
    # those stay whole.
    (6144, 4096, 16): RowsConfig(block_n=64, block_k=128, num_warps=4, num_stages=5),  # q/k/v
    (6144, 4096, 32): RowsConfig(block_n=64, block_k=128, num_warps=4, num_stages=5),
    (6144, 4096, 64): RowsConfig(block_n=64, block_k=128, num_warps=4, num_stages=5),
    (4096, 4096, 16): _O_DOWN,  # o
    (4096, 4096, 32): _O_DOWN,
    (4096, 4096, 64): None,
    (28672, 4096, 16): RowsConfig(block_n=64, block_k=128, num_warps=4, num_stages=3),  # gate/up with SiLU
    (28672, 4096, 32): RowsConfig(block_n=128, block_k=128, num_warps=4, num_stages=3),
    (28672, 4096, 64): RowsConfig(block_n=64, block_k=64, num_warps=4, num_stages=4),
    (4096, 14336, 16): _O_DOWN,  # down
    (4096, 14336, 32): _O_DOWN,
    (4096, 14336, 64): RowsConfig(block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=2),
    (128256, 4096, 16): RowsConfig(block_n=64, block_k=128, num_warps=4, num_stages=3),  # lm_head
    (128256, 4096, 32): RowsConfig(block_n=64, block_k=128, num_warps=4, num_stages=3),
    (128256, 4096, 64): RowsConfig(block_n=64, block_k=64, num_warps=4, num_stages=3),
}


def block_rows(m: int) -> int:
    """BLOCK_M for m rows: the next power of two, at least MIN_BLOCK."""
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"rows must be 1-{MAX_ROWS}, got {m}")
    return max(MIN_BLOCK, next_power_of_2(m))


def choose_config(n: int, k: int, m: int) -> RowsConfig | None:
    """The launch shape for m rows times an [n, k] weight: the measured one, else the
    default, with block_k halved until block_k * split_k divides k. None where cuBLAS
    measured faster, or when k has no power-of-two factor of at least MIN_BLOCK (the
    kernels have no masks along k): the caller then runs F.linear."""
    key = (n, k, block_rows(m))
    config = MEASURED_CONFIGS[key] if key in MEASURED_CONFIGS else DEFAULT_CONFIG
    if config is None:
        return None
    block_k = config.block_k
    while k % (block_k * config.split_k) and block_k > MIN_BLOCK:
        block_k //= 2
    return replace(config, block_k=block_k) if k % (block_k * config.split_k) == 0 else None


if has_triton():
    import triton
    import triton.language as tl

    from .fused_ops import rotate_pair
    from .pdl import release_dependents, wait_for_previous

    @triton.jit
    def _rows_times_weights(x_ptr, w_rows, w_rows_2, rows, row_ok, stride_x, K, TWO: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                            NUM_STAGES: tl.constexpr, SPLIT_K: tl.constexpr):
        """fp32 [BLOCK_N, BLOCK_M] products of the weight rows at `w_rows` [BLOCK_N, 1]
        (and with TWO those at `w_rows_2`) with the input rows, over this program's part
        of K (program_id(1) of SPLIT_K)."""
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        acc_2 = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        x_rows = x_ptr + rows.to(tl.int64)[None, :] * stride_x
        # Unsplit, the loop starts at a constant 0: a start computed from program_id(1)
        # (always 0 then) made the row kernels' decode replays 1.6-3 % slower on the H200,
        # against cuBLAS in the same run.
        if SPLIT_K == 1:
            k_lo = 0
            k_hi = K
        else:
            k_lo = tl.program_id(1) * (K // SPLIT_K)
            k_hi = k_lo + K // SPLIT_K
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
            cols = k0 + tl.arange(0, BLOCK_K)
            xt = tl.load(x_rows + cols[:, None], mask=row_ok[None, :], other=0.0)  # [BLOCK_K, BLOCK_M]
            acc = tl.dot(tl.load(w_rows + cols[None, :], eviction_policy="evict_first"), xt, acc)
            if TWO:
                acc_2 = tl.dot(tl.load(w_rows_2 + cols[None, :], eviction_policy="evict_first"), xt, acc_2)
        return acc, acc_2

    @triton.jit
    def _sum_splits(acc, acc_2, part_ptr, done_ptr, tile, TWO: tl.constexpr, SPLIT_K: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
        """Store this program's partial products of `tile`; (is last, sums): the last of
        the tile's SPLIT_K programs to finish gets every split's products summed in
        split order and re-arms the tile's counter for the next launch (and graph replay)."""
        PARTS: tl.constexpr = 2 if TWO else 1
        size: tl.constexpr = BLOCK_N * BLOCK_M
        at = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        tile_parts = part_ptr + tile.to(tl.int64) * (SPLIT_K * PARTS * size)
        mine = tile_parts + tl.program_id(1) * (PARTS * size) + at
        tl.store(mine, acc)
        if TWO:
            tl.store(mine + size, acc_2)
        tl.debug_barrier()  # every thread's partial stores before the release below
        last = tl.atomic_add(done_ptr + tile, 1, sem="acq_rel") == SPLIT_K - 1
        total = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        total_2 = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        if last:
            for s in tl.static_range(SPLIT_K):
                # .cg: the other splits were written by other programs, possibly on other SMs
                total += tl.load(tile_parts + s * (PARTS * size) + at, cache_modifier=".cg")
                if TWO:
                    total_2 += tl.load(tile_parts + s * (PARTS * size) + size + at, cache_modifier=".cg")
            tl.atomic_xchg(done_ptr + tile, 0)
        return last, total, total_2

    @triton.jit
    def _gemm_epilogue(acc, acc_up, out_ptr, rows, row_ok, cols_n, N, stride_out, ty, SILU_MUL: tl.constexpr):
        if SILU_MUL:
            gate = acc.to(ty).to(tl.float32)
            act = (gate / (1.0 + tl.exp(-gate))).to(ty).to(tl.float32)
            acc = act * acc_up.to(ty).to(tl.float32)
        out = out_ptr + rows.to(tl.int64)[None, :] * stride_out + cols_n[:, None]
        tl.store(out, acc.to(ty).to(out_ptr.dtype.element_ty), mask=(cols_n < N)[:, None] & row_ok[None, :])

    @triton.jit
    def _rows_gemm_kernel(x_ptr, w_ptr, out_ptr, part_ptr, done_ptr, M, N, K, stride_x, stride_w, stride_out,
                          SILU_MUL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, SPLIT_K: tl.constexpr,
                          USE_PDL: tl.constexpr, EARLY_RELEASE: tl.constexpr):
        pid = tl.program_id(0)
        # BLOCK_N output columns; with SILU_MUL their gate rows and the up rows N further on.
        # Columns past N read row N - 1 (no masks in the loop); only their store is masked.
        cols_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        w_row = tl.minimum(cols_n, N - 1).to(tl.int64)[:, None]
        rows = tl.arange(0, BLOCK_M)
        row_ok = rows < M
        ty = w_ptr.dtype.element_ty
        wait_for_previous(USE_PDL)
        acc, acc_up = _rows_times_weights(x_ptr, w_ptr + w_row * stride_w, w_ptr + (w_row + N) * stride_w, rows,
                                          row_ok, stride_x, K, SILU_MUL, BLOCK_N, BLOCK_M, BLOCK_K, NUM_STAGES,
                                          SPLIT_K)
        release_dependents(USE_PDL, EARLY_RELEASE)
        if SPLIT_K > 1:
            last, acc, acc_up = _sum_splits(acc, acc_up, part_ptr, done_ptr, pid, SILU_MUL, SPLIT_K, BLOCK_N, BLOCK_M)
            if last:
                _gemm_epilogue(acc, acc_up, out_ptr, rows, row_ok, cols_n, N, stride_out, ty, SILU_MUL)
        else:
            _gemm_epilogue(acc, acc_up, out_ptr, rows, row_ok, cols_n, N, stride_out, ty, SILU_MUL)

    @triton.jit
    def _qkv_epilogue(y1, y2, out_ptr, rows, row_ok, first, j, head, stride_out, ty, pos_ptr, inv_freq_ptr,
                      slot_ptr, kc_ptr, vc_ptr, stride_cb, stride_ct, stride_ch, num_heads, num_kv_heads,
                      HALF: tl.constexpr, CACHE_BLOCK: tl.constexpr):
        x1 = y1.to(ty)
        x2 = y2.to(ty)
        if head < num_heads + num_kv_heads:  # q or k: rotate-half RoPE at each row's position
            pos = tl.load(pos_ptr + rows, mask=row_ok, other=0).to(tl.float32)
            freqs = tl.load(inv_freq_ptr + j)[:, None] * pos[None, :]
            cos = tl.cos(freqs).to(ty).to(tl.float32)
            sin = tl.sin(freqs).to(ty).to(tl.float32)
            x1, x2 = rotate_pair(x1.to(tl.float32), x2.to(tl.float32), cos, sin, ty)
        out = out_ptr + rows.to(tl.int64)[None, :] * stride_out + first[:, None]
        tl.store(out, x1, mask=row_ok[None, :])
        tl.store(out + HALF, x2, mask=row_ok[None, :])
        if head >= num_heads:  # k or v: into the cache at each real row's slot (-1: a padded row)
            slot = tl.load(slot_ptr + rows, mask=row_ok, other=-1).to(tl.int64)
            write = (slot >= 0)[None, :]
            slot = tl.maximum(slot, 0)
            kv = head - num_heads
            cache = ((slot // CACHE_BLOCK) * stride_cb + (slot % CACHE_BLOCK) * stride_ct)[None, :] + (
                (kv % num_kv_heads) * stride_ch + j
            )[:, None]
            if kv >= num_kv_heads:
                tl.store(vc_ptr + cache, x1.to(vc_ptr.dtype.element_ty), mask=write)
                tl.store(vc_ptr + cache + HALF, x2.to(vc_ptr.dtype.element_ty), mask=write)
            else:
                tl.store(kc_ptr + cache, x1.to(kc_ptr.dtype.element_ty), mask=write)
                tl.store(kc_ptr + cache + HALF, x2.to(kc_ptr.dtype.element_ty), mask=write)

    @triton.jit
    def _rows_qkv_rope_kernel(x_ptr, w_ptr, out_ptr, part_ptr, done_ptr, M, K, stride_x, stride_w, stride_out,
                              pos_ptr, inv_freq_ptr, slot_ptr, kc_ptr, vc_ptr, stride_cb, stride_ct, stride_ch,
                              num_heads, num_kv_heads,
                              HALF: tl.constexpr, PAIRS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                              NUM_STAGES: tl.constexpr, SPLIT_K: tl.constexpr, CACHE_BLOCK: tl.constexpr,
                              USE_PDL: tl.constexpr, EARLY_RELEASE: tl.constexpr):
        """The rows' q/k/v projection, rotary embedding of q and k, and the K/V write into
        the paged cache (as fused_ops.rope_and_cache). A program's outputs are PAIRS dims
        of one head and the PAIRS dims HALF further on, the pairs that rotate together,
        for every row."""
        pid = tl.program_id(0)
        PER_HEAD: tl.constexpr = HALF // PAIRS
        head = pid // PER_HEAD
        j = (pid % PER_HEAD) * PAIRS + tl.arange(0, PAIRS)
        first = head * 2 * HALF + j
        w_first = w_ptr + first.to(tl.int64)[:, None] * stride_w
        rows = tl.arange(0, BLOCK_M)
        row_ok = rows < M
        ty = w_ptr.dtype.element_ty
        wait_for_previous(USE_PDL)
        y1, y2 = _rows_times_weights(x_ptr, w_first, w_first + HALF * stride_w, rows, row_ok, stride_x, K, True,
                                     PAIRS, BLOCK_M, BLOCK_K, NUM_STAGES, SPLIT_K)
        release_dependents(USE_PDL, EARLY_RELEASE)
        if SPLIT_K > 1:
            last, y1, y2 = _sum_splits(y1, y2, part_ptr, done_ptr, pid, True, SPLIT_K, PAIRS, BLOCK_M)
            if last:
                _qkv_epilogue(y1, y2, out_ptr, rows, row_ok, first, j, head, stride_out, ty, pos_ptr, inv_freq_ptr,
                              slot_ptr, kc_ptr, vc_ptr, stride_cb, stride_ct, stride_ch, num_heads, num_kv_heads,
                              HALF, CACHE_BLOCK)
        else:
            _qkv_epilogue(y1, y2, out_ptr, rows, row_ok, first, j, head, stride_out, ty, pos_ptr, inv_freq_ptr,
                          slot_ptr, kc_ptr, vc_ptr, stride_cb, stride_ct, stride_ch, num_heads, num_kv_heads,
                          HALF, CACHE_BLOCK)


def _check(x: torch.Tensor, weight: torch.Tensor, config: RowsConfig | None) -> RowsConfig:
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"x must be [M, K] with 1-{MAX_ROWS} rows, got shape {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1] or weight.stride(1) != 1:
        raise ValueError(
            f"weight must be [N, {x.shape[1]}] with contiguous rows, got {tuple(weight.shape)} strides {weight.stride()}"
        )
    if x.stride(1) != 1:
        raise ValueError("x must have contiguous rows")
    config = config or choose_config(weight.shape[0], x.shape[1], x.shape[0])
    if config is None or x.shape[1] % (config.block_k * config.split_k):
        block_k = config.block_k if config else MIN_BLOCK
        split = f" x split_k={config.split_k}" if config and config.split_k > 1 else ""
        raise ValueError(f"K={x.shape[1]} is not a multiple of block_k={block_k}{split}")
    return config


def _split_buffers(x: torch.Tensor, tiles: int, tile_outputs: int, config: RowsConfig,
                   parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 partial products, zeroed per-tile counters) of a split launch; unsplit, the
    kernel touches neither (the counters stand in for both)."""
    counters = split_counters(x.device, tiles)
    if config.split_k == 1:
        return counters, counters
    part = torch.empty(tiles * config.split_k * parts * tile_outputs * block_rows(x.shape[0]), dtype=torch.float32,
                       device=x.device)
    return part, counters


def rows_gemm(x: torch.Tensor, weight: torch.Tensor, silu_mul: bool = False, out_dtype: torch.dtype | None = None,
              config: RowsConfig | None = None) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T -> [M, N], rounded to weight's dtype (then out_dtype);
    with `silu_mul`, `weight` is the fused [gate; up] of 2I rows and the result is
    silu_and_mul of the product, [M, I]."""
    config = _check(x, weight, config)
    rows = weight.shape[0]
    if silu_mul and rows % 2:
        raise ValueError(f"a fused gate/up weight needs an even number of rows, got {rows}")
    n = rows // 2 if silu_mul else rows
    m, k = x.shape
    out = torch.empty(m, n, dtype=out_dtype or weight.dtype, device=x.device)
    tiles = cdiv(n, config.block_n)
    part, counters = _split_buffers(x, tiles, config.block_n, config, 2 if silu_mul else 1)
    _rows_gemm_kernel[(tiles, config.split_k)](
        x, weight, out, part, counters, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
        SILU_MUL=silu_mul, BLOCK_N=config.block_n, BLOCK_M=block_rows(m), BLOCK_K=config.block_k,
        NUM_STAGES=config.num_stages, SPLIT_K=config.split_k, num_warps=config.num_warps,
        **pdl_launch(x.device, releases=True),
    )
    return out


def qkv_pairs(head_dim: int, config: RowsConfig) -> int:
    """Pairs of rotating dims per program of rows_qkv_rope: block_n // 2, at most half
    the head dim; 0 when that does not split the half head dim into whole dots."""
    half = head_dim // 2
    pairs = min(config.block_n // 2, half)
    return pairs if pairs >= MIN_BLOCK and head_dim % 2 == 0 and half % pairs == 0 else 0


def rows_qkv_rope(x: torch.Tensor, weight: torch.Tensor, num_heads: int, num_kv_heads: int, positions: torch.Tensor,
                  inv_freq: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                  config: RowsConfig | None = None) -> torch.Tensor:
    """qkv [M, (H + 2 KVH) D] of the rows with q and k rotated, each row's k and v written
    into the caches at its slot (nothing for slot -1): what F.linear followed by
    fused_ops.rope_and_cache computes, in one kernel."""
    config = _check(x, weight, config)
    m = x.shape[0]
    head_dim = k_cache.shape[-1]
    pairs = qkv_pairs(head_dim, config)
    if weight.shape[0] != (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(
            f"a fused q/k/v weight has {(num_heads + 2 * num_kv_heads) * head_dim} rows, got {weight.shape[0]}"
        )
    if not pairs:
        raise ValueError(f"block_n={config.block_n} does not split half the head dim ({head_dim // 2}) into pairs")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("K and V caches must share strides with a contiguous head dimension")
    if positions.shape != (m,) or slots.shape != (m,):
        raise ValueError(f"positions and slots must be [{m}], got {tuple(positions.shape)} and {tuple(slots.shape)}")
    out = torch.empty(m, weight.shape[0], dtype=weight.dtype, device=x.device)
    tiles = weight.shape[0] // (2 * pairs)
    part, counters = _split_buffers(x, tiles, pairs, config, 2)
    _rows_qkv_rope_kernel[(tiles, config.split_k)](
        x, weight, out, part, counters, m, x.shape[1], x.stride(0), weight.stride(0), out.stride(0),
        positions, inv_freq, slots, k_cache, v_cache, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        num_heads, num_kv_heads,
        HALF=head_dim // 2, PAIRS=pairs, BLOCK_M=block_rows(m), BLOCK_K=config.block_k,
        NUM_STAGES=config.num_stages, SPLIT_K=config.split_k, CACHE_BLOCK=k_cache.shape[1],
        num_warps=config.num_warps,
        **pdl_launch(x.device, releases=True),
    )
    return out
