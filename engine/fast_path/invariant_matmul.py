"""A matrix product whose every output row is computed the same way whatever the number
of rows: deterministic mode's projections on the GPU (engine/batch_invariant.py).

cuBLAS picks its kernel, tile shape and split-K from the whole problem's shape, so one
row of x @ W.T can round differently in a batch of 1 and in a batch of 200. Here one
kernel with one fixed tiling serves every shape: each program owns a BLOCK_M x BLOCK_N
tile of the output and walks the whole K in BLOCK_K steps, in order, accumulating in
fp32; no split-K, no shape-dependent configuration, so the sum for an output element is
always the same sequence of the same products. A row's result depends on its own input
alone.
"""

from __future__ import annotations

import torch

from .availability import has_triton

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 64

if has_triton():
    import triton
    import triton.language as tl

    @triton.jit
    def _invariant_matmul_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K,
                                 stride_xm, stride_wn, stride_om,
                                 HAS_BIAS: tl.constexpr,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + ks
            x = tl.load(x_ptr + rows[:, None] * stride_xm + k[None, :],
                        mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)
            w = tl.load(w_ptr + cols[None, :] * stride_wn + k[:, None],
                        mask=(cols[None, :] < N) & (k[:, None] < K), other=0.0)
            acc = tl.dot(x, w, acc)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias), in x's dtype, one fixed tiling for every M."""
    x = x.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    _invariant_matmul_kernel[grid](
        x, weight, bias if bias is not None else x, out, m, n, k,
        x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )
    return out
