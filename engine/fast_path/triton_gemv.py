"""Matrix-vector products for batch-1 decode, with the small ops around them fused in.

At batch 1 a decode step is a chain of GEMVs that read 15 GB of weights; everything
between them (RMSNorm with its residual add, SiLU-and-multiply, cuBLAS's split-K
reductions) costs a launch and a few microseconds each, 0.6 ms of a 4.7 ms token on
the H200. These kernels fold that work into the GEMVs themselves:

- `gemv`: y = W x.
- `rms_norm_gemv`: y = W RMSNorm(x + residual) (optionally with SiLU(gate) * up of a
  fused gate/up weight as the epilogue); also returns the new residual x + residual.
- `rms_norm_qkv_rope`: the same for the fused q/k/v weight, with rotary embedding of q
  and k and the K/V write into the paged cache as the epilogue.

One program computes BLOCK_N outputs over the whole K, so no split-K pass is needed;
with SiLU-and-multiply its tile holds BLOCK_N gate rows and the matching up rows.
Every program reads the whole input anyway, so each sums its squares on the way and
divides its outputs by the RMS at the end: W (g * h) / rms(h) in fp32, without the
eager model's rounding of the normalised input to bf16 (reading the input once before
the loop to round exactly as fused_ops.add_rms_norm made the H200's batch-1 step 4 %
slower). Program 0 writes the new residual. SiLU-and-multiply and RoPE round as
fused_ops does.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .availability import has_triton
from .launch_shape import cdiv, check_launch_shape
from .pdl import pdl_launch


@dataclass(frozen=True, slots=True)
class GemvConfig:
    """Launch shape of one GEMV: outputs per program, K per iteration, warps, stages."""

    block_n: int = 8
    block_k: int = 512
    num_warps: int = 4
    num_stages: int = 1

    def __post_init__(self):
        check_launch_shape(self.block_n, self.block_k, self.num_warps, self.num_stages)


DEFAULT_CONFIG = GemvConfig(block_n=8, block_k=256, num_warps=4, num_stages=3)
# Long rows (the down projection) and narrow outputs (o) did better with 4 x 512 tiles.
LONG_ROW_CONFIG = GemvConfig(block_n=4, block_k=512, num_warps=4, num_stages=3)
# The best of 44 launch shapes for llama3-8b-shape's projections [N, K] on the H200, with
# the fused RMSNorm where the decoder uses it (engine/bench/gemv_sweep.py --fused-sweep;
# BENCHMARKS.md); other shapes follow the rule in choose_config.
MEASURED_CONFIGS = {
    (6144, 4096): GemvConfig(block_n=16, block_k=512, num_warps=4, num_stages=3),  # q/k/v
    (4096, 4096): LONG_ROW_CONFIG,  # o
    (28672, 4096): DEFAULT_CONFIG,  # gate/up
    (4096, 14336): LONG_ROW_CONFIG,  # down
    (128256, 4096): GemvConfig(block_n=16, block_k=256, num_warps=4, num_stages=3),  # lm_head
}
MIN_BLOCK_K = 16


def choose_config(n: int, k: int) -> GemvConfig | None:
    """The launch shape for an [n, k] weight; None when k has no power-of-two factor
    of at least MIN_BLOCK_K (the kernel has no masks along k)."""
    if (n, k) in MEASURED_CONFIGS:
        return MEASURED_CONFIGS[n, k]
    base = LONG_ROW_CONFIG if k >= 8192 or n <= 4096 else DEFAULT_CONFIG
    block_k = base.block_k
    while k % block_k:
        block_k //= 2
    return replace(base, block_k=block_k) if block_k >= MIN_BLOCK_K else None


if has_triton():
    import triton
    import triton.language as tl

    from .fused_ops import rope_cos_sin, rotate_pair
    from .pdl import release_dependents, wait_for_previous

    @triton.jit
    def _rows_times_input(x_ptr, res_ptr, res_out_ptr, norm_ptr, w_rows, K, eps, write_residual,
                          NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr,
                          BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr):
        """fp32 products of the weight rows at `w_rows` [ROWS, 1] with the input: x, or with
        NORM the RMSNorm of x (+ residual; the sum is written to res_out when
        `write_residual`)."""
        ty = w_rows.dtype.element_ty
        acc = tl.zeros([ROWS, BLOCK_K], tl.float32)
        sum_sq = tl.zeros([BLOCK_K], tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            cols = k0 + tl.arange(0, BLOCK_K)
            xin = tl.load(x_ptr + cols).to(tl.float32)
            if NORM:
                if HAS_RESIDUAL:
                    xin = (xin + tl.load(res_ptr + cols).to(tl.float32)).to(ty)
                    if write_residual:
                        tl.store(res_out_ptr + cols, xin)
                    xin = xin.to(tl.float32)
                sum_sq += xin * xin  # the RMS divides the sums at the end
                xin = xin * tl.load(norm_ptr + cols).to(tl.float32)
            w = tl.load(w_rows + cols[None, :], eviction_policy="evict_first")
            acc += w.to(tl.float32) * xin[None, :]
        y = tl.sum(acc, 1)
        if NORM:
            y = y / tl.sqrt(tl.sum(sum_sq, 0) / K + eps)
        return y

    @triton.jit
    def _gemv_kernel(x_ptr, res_ptr, res_out_ptr, norm_ptr, w_ptr, out_ptr, N, K, stride_w, eps,
                     NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SILU_MUL: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                     USE_PDL: tl.constexpr, EARLY_RELEASE: tl.constexpr):
        pid = tl.program_id(0)
        # One tile of weight rows: BLOCK_N rows, or with SILU_MUL BLOCK_N gate rows then the
        # BLOCK_N matching up rows (N further down). Rows past N read row N - 1 (no masks in
        # the loop); only their store is masked.
        ROWS: tl.constexpr = 2 * BLOCK_N if SILU_MUL else BLOCK_N
        r = tl.arange(0, ROWS)
        out_rows = pid * BLOCK_N + r % BLOCK_N
        w_rows = w_ptr + (tl.minimum(out_rows, N - 1) + (r // BLOCK_N) * N).to(tl.int64)[:, None] * stride_w
        ty = w_ptr.dtype.element_ty
        wait_for_previous(USE_PDL)
        y = _rows_times_input(x_ptr, res_ptr, res_out_ptr, norm_ptr, w_rows, K, eps, pid == 0, NORM, HAS_RESIDUAL,
                              ROWS, BLOCK_K, NUM_STAGES)
        release_dependents(USE_PDL, EARLY_RELEASE)
        if SILU_MUL:
            gate, up = tl.split(tl.trans(tl.reshape(y, [2, BLOCK_N])))
            gate = gate.to(ty).to(tl.float32)
            act = (gate / (1.0 + tl.exp(-gate))).to(ty).to(tl.float32)
            y = act * up.to(ty).to(tl.float32)
            out_rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(out_ptr + out_rows, y.to(ty).to(out_ptr.dtype.element_ty), mask=out_rows < N)

    @triton.jit
    def _qkv_rope_kernel(x_ptr, res_ptr, res_out_ptr, norm_ptr, w_ptr, out_ptr, K, stride_w, eps,
                         pos_ptr, inv_freq_ptr, slot_ptr, kc_ptr, vc_ptr, stride_cb, stride_ct, stride_ch,
                         num_heads, num_kv_heads,
                         HAS_RESIDUAL: tl.constexpr, HALF: tl.constexpr, PAIRS: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                         CACHE_BLOCK: tl.constexpr, USE_PDL: tl.constexpr, EARLY_RELEASE: tl.constexpr):
        """One token's q/k/v projection with the RMSNorm folded in, rotary embedding of q
        and k, and the K/V write into the paged cache (as fused_ops.rope_and_cache). A
        program's rows are PAIRS dims of one head and the PAIRS dims HALF further on,
        the pairs that rotate together."""
        pid = tl.program_id(0)
        PER_HEAD: tl.constexpr = HALF // PAIRS
        head = pid // PER_HEAD
        j = (pid % PER_HEAD) * PAIRS + tl.arange(0, PAIRS)
        r = tl.arange(0, 2 * PAIRS)
        rows = head * 2 * HALF + (r // PAIRS) * HALF + (pid % PER_HEAD) * PAIRS + r % PAIRS
        w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_w
        ty = w_ptr.dtype.element_ty
        wait_for_previous(USE_PDL)
        y = _rows_times_input(x_ptr, res_ptr, res_out_ptr, norm_ptr, w_rows, K, eps, pid == 0, True, HAS_RESIDUAL,
                              2 * PAIRS, BLOCK_K, NUM_STAGES)
        release_dependents(USE_PDL, EARLY_RELEASE)
        x1, x2 = tl.split(tl.trans(tl.reshape(y.to(ty), [2, PAIRS])))
        if head < num_heads + num_kv_heads:  # q or k: rotate-half RoPE
            cos, sin = rope_cos_sin(pos_ptr, inv_freq_ptr, j, ty)
            x1, x2 = rotate_pair(x1.to(tl.float32), x2.to(tl.float32), cos, sin, ty)
        base = head * 2 * HALF + j
        tl.store(out_ptr + base, x1)
        tl.store(out_ptr + base + HALF, x2)
        slot = tl.load(slot_ptr)
        if head >= num_heads and slot >= 0:  # k or v of a real row (slot -1: a padded graph row)
            kv = head - num_heads
            is_v = kv >= num_kv_heads
            slot = slot.to(tl.int64)
            cache = ((slot // CACHE_BLOCK) * stride_cb + (slot % CACHE_BLOCK) * stride_ct
                     + (kv % num_kv_heads) * stride_ch + j)
            if is_v:
                tl.store(vc_ptr + cache, x1.to(vc_ptr.dtype.element_ty))
                tl.store(vc_ptr + cache + HALF, x2.to(vc_ptr.dtype.element_ty))
            else:
                tl.store(kc_ptr + cache, x1.to(kc_ptr.dtype.element_ty))
                tl.store(kc_ptr + cache + HALF, x2.to(kc_ptr.dtype.element_ty))


def _check(x: torch.Tensor, weight: torch.Tensor, config: GemvConfig | None) -> GemvConfig:
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"x must be one row [1, K], got shape {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1] or weight.stride(1) != 1:
        raise ValueError(f"weight must be [N, {x.shape[1]}] with contiguous rows, got {tuple(weight.shape)} "
                         f"strides {weight.stride()}")
    if not x.is_contiguous():
        raise ValueError("x must be contiguous")
    config = config or choose_config(*weight.shape)
    if config is None or x.shape[1] % config.block_k:
        raise ValueError(f"K={x.shape[1]} is not a multiple of block_k={config.block_k if config else MIN_BLOCK_K}")
    return config


def _check_norm_inputs(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor) -> None:
    if residual is not None and (residual.shape != x.shape or not residual.is_contiguous()):
        raise ValueError(f"residual must be contiguous and shaped like x {tuple(x.shape)}, got {tuple(residual.shape)}")
    if norm_weight.shape != (x.shape[1],):
        raise ValueError(f"norm weight must be [{x.shape[1]}], got {tuple(norm_weight.shape)}")


def _launch(x, residual, res_out, norm_weight, weight, out, n, eps, norm, silu_mul, config):
    k = x.shape[1]
    _gemv_kernel[(cdiv(n, config.block_n),)](
        x, residual if residual is not None else x, res_out if res_out is not None else x,
        norm_weight if norm_weight is not None else x, weight, out, n, k, weight.stride(0), eps,
        NORM=norm, HAS_RESIDUAL=residual is not None, SILU_MUL=silu_mul, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, NUM_STAGES=config.num_stages, num_warps=config.num_warps,
        **pdl_launch(x.device, releases=True),
    )


def rms_norm_qkv_rope(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                      weight: torch.Tensor, num_heads: int, num_kv_heads: int, positions: torch.Tensor,
                      inv_freq: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                      config: GemvConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """For one token: (qkv [1, (H + 2 KVH) D] with q and k rotated, new residual), the
    new k and v written into the caches at `slots[0]` (nothing for slot -1): what
    rms_norm_gemv followed by fused_ops.rope_and_cache computes, in one kernel."""
    config = _check(x, weight, config)
    head_dim = k_cache.shape[-1]
    half, pairs = head_dim // 2, config.block_n // 2
    if weight.shape[0] != (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"a fused q/k/v weight has {(num_heads + 2 * num_kv_heads) * head_dim} rows, "
                         f"got {weight.shape[0]}")
    if head_dim % 2 or pairs < 1 or half % pairs:
        raise ValueError(f"block_n={config.block_n} does not split half the head dim ({half}) into pairs")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("K and V caches must share strides with a contiguous head dimension")
    _check_norm_inputs(x, residual, norm_weight)
    out = torch.empty(1, weight.shape[0], dtype=weight.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else None
    k = x.shape[1]
    _qkv_rope_kernel[(weight.shape[0] // config.block_n,)](
        x, residual if residual is not None else x, res_out if res_out is not None else x, norm_weight, weight, out,
        k, weight.stride(0), eps, positions, inv_freq, slots, k_cache, v_cache,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), num_heads, num_kv_heads,
        HAS_RESIDUAL=residual is not None, HALF=half, PAIRS=pairs, BLOCK_K=config.block_k,
        NUM_STAGES=config.num_stages, CACHE_BLOCK=k_cache.shape[1], num_warps=config.num_warps,
        **pdl_launch(x.device, releases=True),
    )
    return out, res_out if res_out is not None else x


def gemv(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None,
         config: GemvConfig | None = None) -> torch.Tensor:
    """x [1, K] @ weight[N, K].T -> [1, N], rounded to weight's dtype (then out_dtype)."""
    config = _check(x, weight, config)
    n = weight.shape[0]
    out = torch.empty(1, n, dtype=out_dtype or weight.dtype, device=x.device)
    _launch(x, None, None, None, weight, out, n, 0.0, False, False, config)
    return out


def rms_norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                  weight: torch.Tensor, silu_mul: bool = False, out_dtype: torch.dtype | None = None,
                  config: GemvConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(W RMSNorm(x + residual), x + residual) for one row, as fused_ops.add_rms_norm
    followed by F.linear (and silu_and_mul when `silu_mul`: `weight` is the fused
    [gate; up] of 2I rows and the result has I columns). Unlike add_rms_norm the
    residual is not updated in place: the sum is a new tensor (every program reads the
    old one). Without a residual the input itself is the new residual."""
    config = _check(x, weight, config)
    _check_norm_inputs(x, residual, norm_weight)
    rows = weight.shape[0]
    if silu_mul and rows % 2:
        raise ValueError(f"a fused gate/up weight needs an even number of rows, got {rows}")
    n = rows // 2 if silu_mul else rows
    out = torch.empty(1, n, dtype=out_dtype or weight.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else None
    _launch(x, residual, res_out, norm_weight, weight, out, n, eps, True, silu_mul, config)
    return out, res_out if res_out is not None else x
