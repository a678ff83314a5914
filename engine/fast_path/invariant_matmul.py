"""A matrix product whose every output row is computed the same way whatever the number
of rows: deterministic mode's projections on the GPU (engine/batch_invariant.py).

cuBLAS picks its kernel, tile shape and split-K from the whole problem's shape, so one
row of x @ W.T can round differently in a batch of 1 and in a batch of 200. Here one
kernel serves every shape: each program owns a BLOCK_M x block_n tile of the output and
walks the whole K in BLOCK_K steps, in order, accumulating in fp32; no split-K, so the
sum for an output element is always the same sequence of the same products, and a row's
result depends on its own input alone.

Only block_n, how many outputs one program computes, follows the shape (`block_n_for`):
it decides which program computes an output, not how, as BLOCK_M, BLOCK_K and the warps
(the tensor-core instructions' k-steps) stay fixed. On the H200 every output of 1 to
8,192 rows times llama3-8b-shape's five weight shapes was bitwise the same at block_n 16,
32, 64 and 128 (BENCHMARKS.md). Small batches read the weights faster split into more
programs; large ones (prefill) multiply faster in wider tiles: 128 outputs a program ran
8,192-row products 1.3-1.6x faster than 64.
"""

from __future__ import annotations

import torch

from .availability import has_triton

BLOCK_M, BLOCK_K = 64, 64


def block_n_for(m: int, n: int, k: int) -> int:
    """Outputs per program for m rows times an [n, k] weight, from the H200 sweep: 128
    from 256 rows on; below, 64 for the wide (gate/up, LM head) and long (down) products
    and 32 for the rest, which have too few outputs to keep every SM reading."""
    if m >= 256:
        return 128
    return 64 if n >= 8192 or k > 4096 else 32


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


def invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, block_n: int | None = None
) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias), in x's dtype, one fixed tiling for every M.
    `block_n`: outputs per program (a power of two, at least 16); None: block_n_for."""
    x = x.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    block_n = block_n_for(m, n, k) if block_n is None else block_n
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two of at least 16, got {block_n}")
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, block_n))
    _invariant_matmul_kernel[grid](
        x, weight, bias if bias is not None else x, out, m, n, k,
        x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=BLOCK_K,
    )
    return out
