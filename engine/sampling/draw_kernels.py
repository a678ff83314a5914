"""The Triton kernels of triton_draw.py (the host side, and what each kernel computes).

Imported only where triton is installed, at a kernel's first launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .noise import MIN_EXPONENTIAL, UNIFORM_BITS

_ONE_BITS = 0x3F800000  # float32 1.0

# noise.py's constants as uint64 (the torch code holds them as the int64 of the same bits)
_GOLDEN: tl.constexpr = tl.constexpr(0x9E3779B97F4A7C15)
_MIX1: tl.constexpr = tl.constexpr(0xBF58476D1CE4E5B9)
_MIX2: tl.constexpr = tl.constexpr(0x94D049BB133111EB)
_DROP: tl.constexpr = tl.constexpr(64 - UNIFORM_BITS)
_SCALE: tl.constexpr = tl.constexpr(1.0 / (1 << UNIFORM_BITS))
_MIN_E: tl.constexpr = tl.constexpr(MIN_EXPONENTIAL)
_HI: tl.constexpr = tl.constexpr(_ONE_BITS + 1)


@triton.jit
def _hash_bits(stream, cols):
    """noise.uniform's integer bits: mix64(stream + col * GOLDEN) >> (64 - 24), where
    uint64's multiply wraps and its shifts are logical."""
    z = stream + cols.to(tl.uint64) * _GOLDEN
    z = (z ^ (z >> 30)) * _MIX1
    z = (z ^ (z >> 27)) * _MIX2
    z = z ^ (z >> 31)
    return (z >> _DROP).to(tl.int32)


@triton.jit
def top_p_kernel(
    probs_ptr, top_p_ptr, out_ptr, V, stride_row, FAN: tl.constexpr, PASSES: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    base = probs_ptr + row.to(tl.int64) * stride_row
    p = tl.load(top_p_ptr + row)
    k = tl.arange(0, FAN)
    lo = tl.full([], 0, tl.int32)  # mass(>= lo) >= p
    hi = tl.full([], _HI, tl.int32)  # mass(>= hi) < p
    num_passes = tl.where(p < 1.0, PASSES, 0)  # p >= 1 keeps every token: threshold 0
    for _ in range(num_passes):
        step = (hi - lo + FAN - 1) // FAN
        cand = lo + k * step  # cand[0] = lo; the rest split [lo, hi) into FAN pieces
        mass = tl.zeros([FAN], tl.float32)
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < V, other=0.0)
            bits = x.to(tl.int32, bitcast=True)
            mass += tl.sum(tl.where(bits[None, :] >= cand[:, None], x[None, :], 0.0), axis=1)
        ok = ((mass >= p) | (k == 0)) & (cand < hi)  # lo passes; from hi up all fail (but p = 0 passes all)
        new_lo = tl.max(tl.where(ok, cand, 0), axis=0)
        hi = tl.minimum(new_lo + step, hi)  # the next candidate failed (or was hi)
        lo = new_lo
    tl.store(out_ptr + row, lo)


@triton.jit
def draw_chunk_kernel(
    probs_ptr,
    streams_ptr,
    best_ptr,
    where_ptr,
    state_ptr,
    V,
    stride_row,
    num_chunks,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    base = probs_ptr + row.to(tl.int64) * stride_row
    stream = tl.load(streams_ptr + row).to(tl.uint64, bitcast=True)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    where = tl.zeros([BLOCK], tl.int64)
    bad = tl.zeros([BLOCK], tl.int32)
    positive = tl.zeros([BLOCK], tl.int32)
    for start in range(chunk * CHUNK, chunk * CHUNK + CHUNK, BLOCK):
        cols = (start + tl.arange(0, BLOCK)).to(tl.int64)
        in_row = cols < V
        p = tl.load(base + cols, mask=in_row, other=0.0)
        u = (_hash_bits(stream, cols).to(tl.float32) + 0.5) * _SCALE  # noise.uniform's float32 ops
        score = tl.where(in_row, p / tl.maximum(-tl.log(u), _MIN_E), float("-inf"))
        better = score > best  # strictly: each lane keeps its first index of a tie
        best = tl.where(better, score, best)
        where = tl.where(better, cols, where)
        bad += (in_row & ~(tl.abs(p) < float("inf"))).to(tl.int32)  # NaN fails the comparison too
        positive += (p > 0.0).to(tl.int32)
    top = tl.max(best, 0)
    first = tl.min(tl.where(best == top, where, V), 0)  # lanes' indices differ: the first of the tie
    out = row * num_chunks + chunk
    tl.store(best_ptr + out, top)
    tl.store(where_ptr + out, tl.minimum(first, V - 1))
    # 1: some probability is not finite; 2: some is positive
    tl.store(state_ptr + out, (tl.sum(bad, 0) > 0).to(tl.int32) + 2 * (tl.sum(positive, 0) > 0).to(tl.int32))


@triton.jit
def pick_kernel(best_ptr, where_ptr, state_ptr, tokens_ptr, num_chunks, CHUNKS_PAD: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, CHUNKS_PAD)
    valid = c < num_chunks
    best = tl.load(best_ptr + row * num_chunks + c, mask=valid, other=float("-inf"))
    # chunks are in index order: the first chunk holding the maximum holds its first index
    first = tl.minimum(tl.min(tl.where(best == tl.max(best, 0), c, CHUNKS_PAD), 0), num_chunks - 1)
    token = tl.load(where_ptr + row * num_chunks + first)
    state = tl.load(state_ptr + row * num_chunks + c, mask=valid, other=0)
    usable = (tl.max(state & 1, 0) == 0) & (tl.max(state & 2, 0) > 0)
    tl.store(tokens_ptr + row, tl.where(usable, token, -1))


@triton.jit
def bits_kernel(streams_ptr, out_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    stream = tl.load(streams_ptr + row).to(tl.uint64, bitcast=True)
    tl.store(out_ptr + row.to(tl.int64) * V + cols, _hash_bits(stream, cols), mask=cols < V)
