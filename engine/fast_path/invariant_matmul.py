"""A matrix product whose every output row is computed the same way whatever the number
of rows: deterministic mode's projections on the GPU (engine/runner/batch_invariant.py).

cuBLAS picks its kernel, tile shape and split-K from the whole problem's shape, so one
row of x @ W.T can round differently in a batch of 1 and in a batch of 200. Here one
kernel serves every shape: each program owns a BLOCK_M x block_n tile of the output and
walks its part of K in BLOCK_K steps, in order, accumulating in fp32, so the sum for an
output element is always the same sequence of the same products and a row's result
depends on its own input alone.

K may be cut into `split_k` equal parts, each a program of its own; their fp32 partial
sums are added in part order by a second kernel. The part count follows the weight's
shape only (`split_k_for`), never the number of rows, so it changes how a product is
rounded for every batch alike: a weight with few outputs (o, down) otherwise leaves
most SMs idle for a batch of one.

block_n, how many outputs one program computes, follows the whole shape (`block_n_for`):
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
from .launch_shape import cdiv

BLOCK_M, BLOCK_K = 64, 64
REDUCE_BLOCK = 1024


def block_n_for(m: int, n: int, k: int) -> int:
    """Outputs per program for m rows times an [n, k] weight, from the H200 sweeps: 128
    from 256 rows on; 64 from 128 rows and for the wide (gate/up, LM head) and long
    (down) products; 32 for the rest, which have too few outputs to keep every SM reading."""
    if m >= 256:
        return 128
    return 64 if m >= 128 or n >= 8192 or k > 4096 else 32


def split_k_for(n: int, k: int) -> int:
    """Parts of K for an [n, k] weight, the same for every number of rows: enough for
    about 256 programs of 64 outputs at one row, at most 4, each part at least 512 long.
    llama3-8b-shape on the H200 (`python -m inferd.engine.bench.invariant_sweep`, graph
    replays, one row): q/k/v 2 parts 20.9 against 29.2 us, o 4 parts 14.6 against 26.9,
    down 4 parts 42.0 against 104.6; gate/up and the LM head ran slower split. Prefill
    pays a little: at 8,192 rows q/k/v took 1,006 against 885 us, o 790 against 573,
    down 2,222 against 2,152."""
    parts = max(1, min(4, 256 // -(-n // 64)))
    return max(1, min(parts, k // 512))


if has_triton():
    import triton
    import triton.language as tl

    @triton.jit
    def _invariant_matmul_kernel(
        x_ptr,
        w_ptr,
        bias_ptr,
        out_ptr,
        M,
        N,
        K,
        k_per_split,
        stride_xm,
        stride_wn,
        stride_om,
        stride_os,
        HAS_BIAS: tl.constexpr,
        SPLIT: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        """Program (m, n, s): the tile's sum over K part s. Unsplit (SPLIT False) it adds
        the bias and stores in out's dtype; split, it stores the fp32 partial at
        out_ptr + s * stride_os for _sum_parts_kernel."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        part = tl.program_id(2)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        if SPLIT:
            k_start = part * k_per_split
            k_end = tl.minimum(k_start + k_per_split, K)
        else:  # constant bounds: a start read from program_id made the row kernels slower
            k_start = 0
            k_end = K
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            k = k0 + ks
            x = tl.load(
                x_ptr + rows[:, None] * stride_xm + k[None, :],
                mask=(rows[:, None] < M) & (k[None, :] < k_end),
                other=0.0,
            )
            w = tl.load(
                w_ptr + cols[None, :] * stride_wn + k[:, None],
                mask=(cols[None, :] < N) & (k[:, None] < k_end),
                other=0.0,
            )
            acc = tl.dot(x, w, acc)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        if SPLIT:
            tl.store(out_ptr + part * stride_os + rows[:, None] * stride_om + cols[None, :], acc, mask=mask)
        else:
            if HAS_BIAS:
                acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
            tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _sum_parts_kernel(
        part_ptr,
        bias_ptr,
        out_ptr,
        N,
        stride_ps,
        stride_pm,
        stride_om,
        PARTS: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """Row m's outputs: the K parts' fp32 sums added in part order, then the bias."""
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < N
        acc = tl.load(part_ptr + row * stride_pm + cols, mask=mask, other=0.0)
        for s in tl.static_range(1, PARTS):
            acc += tl.load(part_ptr + s * stride_ps + row * stride_pm + cols, mask=mask, other=0.0)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def invariant_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    block_n: int | None = None,
    split_k: int | None = None,
) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias), in x's dtype, one fixed tiling for every M.
    `block_n`: outputs per program (a power of two, at least 16); None: block_n_for.
    `split_k`: parts of K summed in order; None: split_k_for (rounding depends on it, so
    every call for one weight must use the same)."""
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
    split_k = split_k_for(n, k) if split_k is None else split_k
    if split_k < 1:
        raise ValueError(f"split_k must be at least 1, got {split_k}")
    # each part a whole number of BLOCK_K steps, so parts start where the unsplit walk does
    k_per_split = cdiv(cdiv(k, split_k), BLOCK_K) * BLOCK_K
    grid = (cdiv(m, BLOCK_M), cdiv(n, block_n), split_k)
    bias_arg = bias if bias is not None else x
    if split_k == 1:
        _invariant_matmul_kernel[grid](
            x,
            weight,
            bias_arg,
            out,
            m,
            n,
            k,
            k_per_split,
            x.stride(0),
            weight.stride(0),
            out.stride(0),
            0,
            HAS_BIAS=bias is not None,
            SPLIT=False,
            BLOCK_M=BLOCK_M,
            BLOCK_N=block_n,
            BLOCK_K=BLOCK_K,
        )
        return out
    parts = torch.empty(split_k, m, n, dtype=torch.float32, device=x.device)
    _invariant_matmul_kernel[grid](
        x,
        weight,
        bias_arg,
        parts,
        m,
        n,
        k,
        k_per_split,
        x.stride(0),
        weight.stride(0),
        parts.stride(1),
        parts.stride(0),
        HAS_BIAS=False,
        SPLIT=True,
        BLOCK_M=BLOCK_M,
        BLOCK_N=block_n,
        BLOCK_K=BLOCK_K,
    )
    _sum_parts_kernel[(m, cdiv(n, REDUCE_BLOCK))](
        parts,
        bias_arg,
        out,
        n,
        parts.stride(0),
        parts.stride(1),
        out.stride(0),
        PARTS=split_k,
        HAS_BIAS=bias is not None,
        BLOCK=REDUCE_BLOCK,
    )
    return out
