"""Matrix-vector products for batch-1 decode, with the small ops around them fused in.

At batch 1 a decode step is a chain of GEMVs that read 15 GB of weights; everything
between them (RMSNorm with its residual add, SiLU-and-multiply, cuBLAS's split-K
reductions) costs a launch and a few microseconds each, 0.6 ms of a 4.7 ms token on
the H200. These kernels fold that work into the GEMVs themselves:

- `gemv`: y = W x.
- `rms_norm_gemv`: y = W RMSNorm(x + residual) (optionally with SiLU(gate) * up of a
  fused gate/up weight as the epilogue); also returns the new residual x + residual.

One program computes BLOCK_N outputs over the whole K, so no split-K pass is needed.
Every program needs the RMS of the whole input, so each first reads the input vector
(a few KiB from L2) and computes it; program 0 writes the new residual. The rounding
follows fused_ops.add_rms_norm and silu_and_mul (and so the eager model) exactly;
only the order of the fp32 sums differs from cuBLAS.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .availability import has_triton
from .pdl import pdl_launch


@dataclass(frozen=True, slots=True)
class GemvConfig:
    """Launch shape of one GEMV: outputs per program, K per iteration, warps, stages."""

    block_n: int = 8
    block_k: int = 512
    num_warps: int = 4
    num_stages: int = 1
    prefetch_k: int = 0  # with PDL: columns of each program's rows prefetched into L2 before waiting

    def __post_init__(self):
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if self.prefetch_k < 0:
            raise ValueError(f"prefetch_k must be at least 0, got {self.prefetch_k}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be at least 1, got {self.num_stages}")


DEFAULT_CONFIG = GemvConfig(block_n=8, block_k=256, num_warps=4, num_stages=3)
# Long rows (the down projection) and narrow outputs (o) did better with 4 x 512 tiles
# (engine/bench/gemv_sweep.py on the H200, BENCHMARKS.md).
LONG_ROW_CONFIG = GemvConfig(block_n=4, block_k=512, num_warps=4, num_stages=3)
MIN_BLOCK_K = 16


def choose_config(n: int, k: int) -> GemvConfig | None:
    """The launch shape for an [n, k] weight; None when k has no power-of-two factor
    of at least MIN_BLOCK_K (the kernel has no masks along k)."""
    base = LONG_ROW_CONFIG if k >= 8192 or n <= 4096 else DEFAULT_CONFIG
    block_k = base.block_k
    while k % block_k:
        block_k //= 2
    return replace(base, block_k=block_k) if block_k >= MIN_BLOCK_K else None

if has_triton():
    import triton
    import triton.language as tl

    from .pdl import wait_for_previous

    @triton.jit
    def _prefetch_l2(ptrs):
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)

    @triton.jit
    def _gemv_kernel(x_ptr, res_ptr, res_out_ptr, norm_ptr, w_ptr, out_ptr, N, K, stride_w, up_offset, eps,
                     NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SILU_MUL: tl.constexpr,
                     K_POW2: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     NUM_STAGES: tl.constexpr, USE_PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr,
                     LINE: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        # Rows past N read row N - 1 (no masks in the loop); only their store is masked.
        w_rows = w_ptr + tl.minimum(rows, N - 1).to(tl.int64)[:, None] * stride_w
        ty = w_ptr.dtype.element_ty
        if PREFETCH_LINES > 0:  # weights are constant: fetch the first ones while the previous kernel ends
            lines = tl.minimum(tl.arange(0, PREFETCH_LINES) * LINE, K - 1)
            _prefetch_l2(w_rows + lines[None, :])
            if SILU_MUL:
                _prefetch_l2(w_rows + up_offset + lines[None, :])
        wait_for_previous(USE_PDL)
        if NORM:
            kk = tl.arange(0, K_POW2)
            whole = kk < K
            h = tl.load(x_ptr + kk, mask=whole, other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                h = (h + tl.load(res_ptr + kk, mask=whole, other=0.0).to(tl.float32)).to(ty)
                if pid == 0:
                    tl.store(res_out_ptr + kk, h, mask=whole)
                h = h.to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(h * h, 0) / K + eps)
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        if SILU_MUL:
            acc_up = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            cols = k0 + tl.arange(0, BLOCK_K)
            xin = tl.load(x_ptr + cols).to(tl.float32)
            if NORM:
                if HAS_RESIDUAL:
                    xin = (xin + tl.load(res_ptr + cols).to(tl.float32)).to(ty).to(tl.float32)
                normed = (xin * rstd).to(ty).to(tl.float32)
                xin = (normed * tl.load(norm_ptr + cols).to(tl.float32)).to(ty).to(tl.float32)
            w = tl.load(w_rows + cols[None, :], eviction_policy="evict_first")
            acc += w.to(tl.float32) * xin[None, :]
            if SILU_MUL:
                w_up = tl.load(w_rows + up_offset + cols[None, :], eviction_policy="evict_first")
                acc_up += w_up.to(tl.float32) * xin[None, :]
        y = tl.sum(acc, 1)
        if SILU_MUL:
            gate = y.to(ty).to(tl.float32)
            up = tl.sum(acc_up, 1).to(ty).to(tl.float32)
            act = (gate / (1.0 + tl.exp(-gate))).to(ty).to(tl.float32)
            y = act * up
        tl.store(out_ptr + rows, y.to(ty).to(out_ptr.dtype.element_ty), mask=rows < N)


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


def _launch(x, residual, res_out, norm_weight, weight, out, n, up_offset, eps, norm, silu_mul, config):
    k = x.shape[1]
    pdl = pdl_launch(x.device)
    line = 128 // weight.element_size()
    prefetch = pdl["USE_PDL"] > 0 and config.prefetch_k > 0
    prefetch_lines = triton.next_power_of_2(triton.cdiv(min(config.prefetch_k, k), line)) if prefetch else 0
    _gemv_kernel[(triton.cdiv(n, config.block_n),)](
        x, residual if residual is not None else x, res_out if res_out is not None else x,
        norm_weight if norm_weight is not None else x, weight, out, n, k, weight.stride(0), up_offset, eps,
        NORM=norm, HAS_RESIDUAL=residual is not None, SILU_MUL=silu_mul, K_POW2=triton.next_power_of_2(k),
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, NUM_STAGES=config.num_stages,
        PREFETCH_LINES=prefetch_lines, LINE=line, num_warps=config.num_warps, **pdl,
    )


def gemv(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None,
         config: GemvConfig | None = None) -> torch.Tensor:
    """x [1, K] @ weight[N, K].T -> [1, N], rounded to weight's dtype (then out_dtype)."""
    config = _check(x, weight, config)
    n = weight.shape[0]
    out = torch.empty(1, n, dtype=out_dtype or weight.dtype, device=x.device)
    _launch(x, None, None, None, weight, out, n, 0, 0.0, False, False, config)
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
    if residual is not None and (residual.shape != x.shape or not residual.is_contiguous()):
        raise ValueError(f"residual must be contiguous and shaped like x {tuple(x.shape)}, got {tuple(residual.shape)}")
    if norm_weight.shape != (x.shape[1],):
        raise ValueError(f"norm weight must be [{x.shape[1]}], got {tuple(norm_weight.shape)}")
    rows = weight.shape[0]
    if silu_mul and rows % 2:
        raise ValueError(f"a fused gate/up weight needs an even number of rows, got {rows}")
    n = rows // 2 if silu_mul else rows
    out = torch.empty(1, n, dtype=out_dtype or weight.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else None
    _launch(x, residual, res_out, norm_weight, weight, out, n, n * weight.stride(0) if silu_mul else 0, eps, True,
            silu_mul, config)
    return out, res_out if res_out is not None else x
