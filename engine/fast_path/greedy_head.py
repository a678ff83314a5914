"""Greedy tokens and the finiteness check of a decode step, on the device, in two kernels.

A decode step ends with two questions about its logits: which token is each row's
argmax, and is every logit finite (the fast path's health check). Asked with torch
(`argmax`, then `isfinite(...).all()`) they cost about 58 us per batch-1 step on the
H200, outside the decode graph (a profile of the engine, 2026-11-29) --
over 1 % of a 4.4 ms token. Here a first kernel splits each row into chunks and finds
each chunk's maximum, its first index and its count of non-finite values; a second
kernel, one program, picks each row's best chunk and folds the counts into one flag.
Both run inside the decode graph, and the result is one tensor the host reads with a
single copy:

    packed[0]      1 when every logit of every live row is finite, else 0
    packed[1 + i]  row i's argmax (its first index on ties, as torch.argmax)

Rows whose `live` entry is 0 (the graph's padding rows) are left out of the flag.
A row holding NaN gets an arbitrary token: the flag is 0 then, and the step's tokens
are not used.
"""
from __future__ import annotations

import os

import torch

from .availability import has_triton
from .launch_shape import next_power_of_2
from .pdl import pdl_launch

CHUNK = 4096  # logits per program of the first kernel (128256 / 4096: 32 programs per row)
BLOCK = 1024  # logits per iteration within a chunk (divides CHUNK)


def greedy_with_flag(logits: torch.Tensor, live: torch.Tensor | None = None) -> torch.Tensor:
    """[1 + B] int64 as in the module doc, for float logits [B, V]; `live` [B] (any
    integer dtype): rows to check, where non-zero (None: all)."""
    if logits.dim() != 2 or logits.shape[0] < 1 or logits.shape[1] < 1:
        raise ValueError(f"logits must be [rows, vocab] with both at least 1, got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    if live is not None and (live.shape != logits.shape[:1] or live.device != logits.device):
        raise ValueError(f"live must be [{logits.shape[0]}] on {logits.device}, "
                         f"got {tuple(live.shape)} on {live.device}")
    if not _kernels_run_on(logits.device):
        return greedy_with_flag_reference(logits, live)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    rows, vocab = logits.shape
    chunks = -(-vocab // CHUNK)
    best = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)
    where = torch.empty(rows, chunks, dtype=torch.int64, device=logits.device)
    bad = torch.empty(rows, chunks, dtype=torch.int32, device=logits.device)
    packed = torch.empty(rows + 1, dtype=torch.int64, device=logits.device)
    pdl = pdl_launch(logits.device)
    _chunk_max_kernel[(rows, chunks)](logits, best, where, bad, vocab, logits.stride(0), chunks,
                                      CHUNK=CHUNK, BLOCK=BLOCK, **pdl)
    _pick_kernel[(1,)](best, where, bad, live if live is not None else packed, packed, rows, chunks,
                       HAS_LIVE=live is not None, ROWS_PAD=max(2, next_power_of_2(rows)),
                       CHUNKS_PAD=max(2, next_power_of_2(chunks)), num_warps=4, **pdl)
    return packed


def _kernels_run_on(device: torch.device) -> bool:
    return has_triton() and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def greedy_with_flag_reference(logits: torch.Tensor, live: torch.Tensor | None = None) -> torch.Tensor:
    """The same answer through torch ops (the tests' oracle and the non-Triton path)."""
    checked = logits if live is None else logits[live != 0]
    flag = torch.isfinite(checked).all().to(torch.int64).view(1)
    return torch.cat([flag, logits.argmax(dim=-1)])


if has_triton():
    import triton
    import triton.language as tl

    from .pdl import wait_for_previous

    @triton.jit
    def _chunk_max_kernel(logits_ptr, best_ptr, where_ptr, bad_ptr, V, stride_row, num_chunks,
                          CHUNK: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        where = tl.zeros([BLOCK], tl.int64)
        bad = tl.zeros([BLOCK], tl.int32)
        wait_for_previous(USE_PDL)
        for start in range(chunk * CHUNK, chunk * CHUNK + CHUNK, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            in_row = cols < V
            x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + cols, mask=in_row,
                        other=float("-inf")).to(tl.float32)
            bad += (in_row & ~(tl.abs(x) < float("inf"))).to(tl.int32)  # NaN fails the comparison too
            better = x > best  # strictly: each lane keeps its first index of a tie
            best = tl.where(better, x, best)
            where = tl.where(better, cols.to(tl.int64), where)
        top = tl.max(best, 0)
        first = tl.min(tl.where(best == top, where, V), 0)  # lanes' indices differ: the first of the tie
        out = row * num_chunks + chunk
        tl.store(best_ptr + out, top)
        tl.store(where_ptr + out, tl.minimum(first, V - 1))
        tl.store(bad_ptr + out, tl.sum(bad, 0))

    @triton.jit
    def _pick_kernel(best_ptr, where_ptr, bad_ptr, live_ptr, packed_ptr, rows, num_chunks,
                     HAS_LIVE: tl.constexpr, ROWS_PAD: tl.constexpr, CHUNKS_PAD: tl.constexpr,
                     USE_PDL: tl.constexpr):
        r = tl.arange(0, ROWS_PAD)
        c = tl.arange(0, CHUNKS_PAD)
        valid = (r[:, None] < rows) & (c[None, :] < num_chunks)
        offs = r[:, None] * num_chunks + c[None, :]
        wait_for_previous(USE_PDL)
        best = tl.load(best_ptr + offs, mask=valid, other=float("-inf"))
        # The first chunk holding the row's maximum; chunks are in index order, so its
        # first index is the row's first index of the maximum.
        top = tl.max(best, 1)
        first_chunk = tl.min(tl.where(best == top[:, None], c[None, :], CHUNKS_PAD), 1)
        first_chunk = tl.minimum(first_chunk, num_chunks - 1)
        token = tl.load(where_ptr + r * num_chunks + first_chunk, mask=r < rows, other=0)
        bad = tl.sum(tl.load(bad_ptr + offs, mask=valid, other=0), 1)
        if HAS_LIVE:
            bad = tl.where(tl.load(live_ptr + r, mask=r < rows, other=0) != 0, bad, 0)
        tl.store(packed_ptr + 1 + r, token, mask=r < rows)
        tl.store(packed_ptr, (tl.sum(bad, 0) == 0).to(tl.int64))
