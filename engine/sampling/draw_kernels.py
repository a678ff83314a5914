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
def _mix64(z):
    """noise.mix64 in uint64."""
    z = (z ^ (z >> 30)) * _MIX1
    z = (z ^ (z >> 27)) * _MIX2
    return z ^ (z >> 31)


@triton.jit
def _hash_bits(stream, cols):
    """noise.uniform's integer bits: mix64(stream + col * GOLDEN) >> (64 - 24), where
    uint64's multiply wraps and its shifts are logical."""
    return (_mix64(stream + cols.to(tl.uint64) * _GOLDEN) >> _DROP).to(tl.int32)


@triton.jit
def streams_kernel(
    seed_key_ptr, is_seeded_ptr, positions_ptr, slots_ptr, out_ptr, engine_key, draw_base, rows, BLOCK: tl.constexpr
):
    """draw.noise_streams: row_streams(seed key, position) for seeded rows, else
    row_streams(engine key, slot + draw_base)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = i < rows
    seed_key = tl.load(seed_key_ptr + i, mask=valid, other=0).to(tl.uint64, bitcast=True)
    position = tl.load(positions_ptr + i, mask=valid, other=0).to(tl.uint64, bitcast=True)
    slot = tl.load(slots_ptr + i, mask=valid, other=0).to(tl.uint64, bitcast=True)
    seeded = tl.load(is_seeded_ptr + i, mask=valid, other=0) != 0
    # Triton passes an int argument of 0 or 1 as a Python constant: widen through a tensor.
    zero = tl.zeros([BLOCK], tl.int64)
    unseeded_key = (zero + engine_key).to(tl.uint64, bitcast=True)
    counter_base = (zero + draw_base).to(tl.uint64, bitcast=True)
    key = tl.where(seeded, seed_key, unseeded_key)
    counter = tl.where(seeded, position, slot + counter_base)
    stream = _mix64(_mix64(key + _GOLDEN) + counter)
    tl.store(out_ptr + i, stream.to(tl.int64, bitcast=True), mask=valid)


@triton.jit
def _narrow(lo, hi, mass, p, FAN: tl.constexpr):
    """One pass's step of the search: [lo, hi) cut into FAN pieces at cand = lo + k * step;
    `mass` [FAN] the mass at or above each cand. Keeps mass(>= lo) >= p and mass(>= hi) < p."""
    k = tl.arange(0, FAN)
    step = (hi - lo + FAN - 1) // FAN
    cand = lo + k * step
    ok = ((mass >= p) | (k == 0)) & (cand < hi)  # lo passes; from hi up all fail (but p = 0 passes all)
    new_lo = tl.max(tl.where(ok, cand, 0), axis=0)
    return new_lo, tl.minimum(new_lo + step, hi)  # the next candidate failed (or was hi)


@triton.jit
def _masses(base, lo, hi, start, stop, V, FAN: tl.constexpr, BLOCK: tl.constexpr):
    """[FAN]: the mass of probabilities in columns [start, stop) at or above each candidate
    of [lo, hi). Sums per lane, reduced across lanes once: a reduction per chunk (warp
    shuffles and shared memory each time) cost ten times the compares."""
    cand = lo + tl.arange(0, FAN) * ((hi - lo + FAN - 1) // FAN)
    acc = tl.zeros([FAN, BLOCK], tl.float32)
    for chunk in range(start, stop, BLOCK):
        cols = chunk + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=(cols < V) & (cols < stop), other=0.0)
        bits = x.to(tl.int32, bitcast=True)
        acc += tl.where(bits[None, :] >= cand[:, None], x[None, :], 0.0)
    return tl.sum(acc, axis=1)


@triton.jit
def top_p_kernel(
    probs_ptr, top_p_ptr, out_ptr, V, stride_row, FAN: tl.constexpr, PASSES: tl.constexpr, BLOCK: tl.constexpr
):
    """One program per row, every pass."""
    row = tl.program_id(0)
    base = probs_ptr + row.to(tl.int64) * stride_row
    p = tl.load(top_p_ptr + row)
    lo = tl.full([], 0, tl.int32)  # mass(>= lo) >= p
    hi = tl.full([], _HI, tl.int32)  # mass(>= hi) < p
    num_passes = tl.where(p < 1.0, PASSES, 0)  # p >= 1 keeps every token: threshold 0
    for _ in range(num_passes):
        lo, hi = _narrow(lo, hi, _masses(base, lo, hi, 0, V, V, FAN, BLOCK), p, FAN)
    tl.store(out_ptr + row, lo)


@triton.jit
def top_p_split_pass_kernel(
    probs_ptr,
    top_p_ptr,
    bounds_ptr,
    partial_ptr,
    V,
    stride_row,
    rows,
    slice_len,
    pass_index,
    SPLIT: tl.constexpr,
    FAN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One pass of the search with each row cut into SPLIT slices, a program each (for few
    rows: one program a row leaves most SMs idle). Every program of a row narrows the
    previous pass's bounds by the sum of its slices' masses (the same sum in each); the
    first writes the bounds. Launched once per pass, then top_p_split_finish_kernel."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    lo = tl.full([], 0, tl.int32)
    hi = tl.full([], _HI, tl.int32)
    if pass_index > 0:
        lo, hi = _split_bounds(top_p_ptr, bounds_ptr, partial_ptr, row, rows, pass_index - 1, SPLIT, FAN)
    if part == 0:
        here = bounds_ptr + (pass_index * rows + row) * 2
        tl.store(here, lo)
        tl.store(here + 1, hi)
    base = probs_ptr + row.to(tl.int64) * stride_row
    mass = _masses(base, lo, hi, part * slice_len, part * slice_len + slice_len, V, FAN, BLOCK)
    tl.store(partial_ptr + ((pass_index * rows + row) * SPLIT + part) * FAN + tl.arange(0, FAN), mass)


@triton.jit
def _split_bounds(top_p_ptr, bounds_ptr, partial_ptr, row, rows, pass_index, SPLIT: tl.constexpr, FAN: tl.constexpr):
    """The bounds after pass `pass_index`: its bounds narrowed by its slices' summed masses."""
    p = tl.load(top_p_ptr + row)
    here = bounds_ptr + (pass_index * rows + row) * 2
    offsets = ((pass_index * rows + row) * SPLIT + tl.arange(0, SPLIT))[:, None] * FAN + tl.arange(0, FAN)[None, :]
    mass = tl.sum(tl.load(partial_ptr + offsets), axis=0)
    return _narrow(tl.load(here), tl.load(here + 1), mass, p, FAN)


@triton.jit
def top_p_split_finish_kernel(
    top_p_ptr, bounds_ptr, partial_ptr, out_ptr, rows, last_pass, SPLIT: tl.constexpr, FAN: tl.constexpr
):
    row = tl.program_id(0)
    p = tl.load(top_p_ptr + row)
    lo, _ = _split_bounds(top_p_ptr, bounds_ptr, partial_ptr, row, rows, last_pass, SPLIT, FAN)
    tl.store(out_ptr + row, tl.where(p < 1.0, lo, 0))  # p >= 1 keeps every token: threshold 0


@triton.jit
def draw_chunk_kernel(
    logits_ptr,
    temperature_ptr,
    floor_ptr,
    greedy_ptr,
    streams_ptr,
    best_ptr,
    where_ptr,
    fallback_best_ptr,
    fallback_where_ptr,
    state_ptr,
    V,
    stride_row,
    num_chunks,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    base = logits_ptr + row.to(tl.int64) * stride_row
    stream = tl.load(streams_ptr + row).to(tl.uint64, bitcast=True)
    temperature = tl.load(temperature_ptr + row)
    floor = tl.load(floor_ptr + row)
    greedy = tl.load(greedy_ptr + row) != 0
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    where = tl.zeros([BLOCK], tl.int64)
    fallback_best = tl.full([BLOCK], float("-inf"), tl.float32)
    fallback_where = tl.zeros([BLOCK], tl.int64)
    bad = tl.zeros([BLOCK], tl.int32)
    usable = tl.zeros([BLOCK], tl.int32)
    for start in range(chunk * CHUNK, chunk * CHUNK + CHUNK, BLOCK):
        cols = (start + tl.arange(0, BLOCK)).to(tl.int64)
        in_row = cols < V
        x = tl.load(base + cols, mask=in_row, other=float("-inf")).to(tl.float32)
        finite_or_inf = tl.where(x != x, float("-inf"), x)
        better = finite_or_inf > fallback_best  # the argmax of the logits, NaN as -inf
        fallback_best = tl.where(better, finite_or_inf, fallback_best)
        fallback_where = tl.where(better, cols, fallback_where)
        kept = in_row & (x >= floor)
        u = (_hash_bits(stream, cols).to(tl.float32) + 0.5) * _SCALE  # noise.uniform's float32 ops
        noisy = x / temperature - tl.log(tl.maximum(-tl.log(u), _MIN_E))
        score = tl.where(kept, noisy, float("-inf"))
        better = score > best  # strictly: each lane keeps its first index of a tie
        best = tl.where(better, score, best)
        where = tl.where(better, cols, where)
        bad += (in_row & ((x != x) | (x == float("inf")))).to(tl.int32)
        usable += (kept & (x > float("-inf"))).to(tl.int32)
    out = row * num_chunks + chunk
    top = tl.max(best, 0)
    tl.store(best_ptr + out, top)
    tl.store(where_ptr + out, tl.minimum(tl.min(tl.where(best == top, where, V), 0), V - 1))
    fallback_top = tl.max(fallback_best, 0)
    tl.store(fallback_best_ptr + out, fallback_top)
    fallback_first = tl.min(tl.where(fallback_best == fallback_top, fallback_where, V), 0)
    tl.store(fallback_where_ptr + out, tl.minimum(fallback_first, V - 1))
    # 1: some logit is NaN or +inf; 2: some kept logit is finite; 4: the row is greedy
    state = (tl.sum(bad, 0) > 0).to(tl.int32) + 2 * (tl.sum(usable, 0) > 0).to(tl.int32) + 4 * greedy.to(tl.int32)
    tl.store(state_ptr + out, state)


@triton.jit
def _first_max(best_ptr, where_ptr, row, num_chunks, CHUNKS_PAD: tl.constexpr):
    """The index of a row's largest value from its chunks' (max, first index) pairs."""
    c = tl.arange(0, CHUNKS_PAD)
    best = tl.load(best_ptr + row * num_chunks + c, mask=c < num_chunks, other=float("-inf"))
    # chunks are in index order: the first chunk holding the maximum holds its first index
    first = tl.minimum(tl.min(tl.where(best == tl.max(best, 0), c, CHUNKS_PAD), 0), num_chunks - 1)
    return tl.load(where_ptr + row * num_chunks + first)


@triton.jit
def pick_kernel(
    best_ptr,
    where_ptr,
    fallback_best_ptr,
    fallback_where_ptr,
    state_ptr,
    tokens_ptr,
    num_chunks,
    CHUNKS_PAD: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.arange(0, CHUNKS_PAD)
    state = tl.load(state_ptr + row * num_chunks + c, mask=c < num_chunks, other=0)
    drawn = _first_max(best_ptr, where_ptr, row, num_chunks, CHUNKS_PAD)
    argmax = _first_max(fallback_best_ptr, fallback_where_ptr, row, num_chunks, CHUNKS_PAD)
    usable = (tl.max(state & 1, 0) == 0) & (tl.max(state & 2, 0) > 0) & (tl.max(state & 4, 0) == 0)
    tl.store(tokens_ptr + row, tl.where(usable, drawn, argmax))


@triton.jit
def count_at_least_kernel(values_ptr, floor_ptr, out_ptr, V, stride_row, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = values_ptr + row.to(tl.int64) * stride_row
    floor = tl.load(floor_ptr + row)
    count = tl.zeros([BLOCK], tl.int32)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < V, other=float("-inf"))
        count += ((cols < V) & (x >= floor)).to(tl.int32)
    tl.store(out_ptr + row, tl.sum(count, 0).to(tl.int64))


@triton.jit
def bits_kernel(streams_ptr, out_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    stream = tl.load(streams_ptr + row).to(tl.uint64, bitcast=True)
    tl.store(out_ptr + row.to(tl.int64) * V + cols, _hash_bits(stream, cols), mask=cols < V)
