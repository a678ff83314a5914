"""The draw's two costly parts as Triton kernels: the top-p threshold and the noise argmax.

Same answers as the torch code beside them (filters.top_p_threshold, draw.draw_reference), which stays the CPU path and the tests' oracle; draw.py takes these
on CUDA unless INFERD_TRITON_SAMPLING=0, read at each call so that one process can
compare both paths.

- top_p_threshold: the largest float32 bit pattern t with mass(probs whose bits >= t) >= p,
  one program per row. The torch code halves [lo, hi) 30 times, one pass over the row
  each; here each pass tests FAN = 16 evenly spaced candidates at once (a [FAN, BLOCK]
  compare and masked sum per chunk of the row) and narrows [lo, hi) 16-fold, so
  passes_for(FAN) = 8 passes pin the pattern (16^8 > 0x3F800001 patterns in [0, 1.0]). The
  invariant mass(>= lo) >= p holds throughout (lo starts at 0, as in the torch code), and
  no candidate at or above hi is tested. The float32 sums run in another order than
  torch's, so a set whose mass lies within rounding of p may gain or lose its last token.
- draw_tokens: argmax_j l_j / T - log E_j over the logits at or above the row's floor,
  E_j noise.exponential's variate (draw.draw_reference), in one pass over the row: the
  splitmix64 hash in uint64 arithmetic inside the kernel (no [B, V] int64 temporaries),
  the row cut into CHUNK-wide programs and the chunks' winners picked by a second kernel
  (lowest index on ties, as torch.argmax). The integer noise bits equal noise.uniform's;
  the kernel's logs may differ from torch's in the last ulp, which moves only a near-tie.
  The same pass takes the argmax of the logits: the token of a greedy row, and of a row
  with nothing to draw from (a NaN or +inf logit, or no finite logit kept).
"""

from __future__ import annotations

import importlib.util
import os

import torch

# fast_path/availability.has_triton's check, inlined: engine.fast_path imports this package.
HAS_TRITON = importlib.util.find_spec("triton") is not None
ENV_SWITCH = "INFERD_TRITON_SAMPLING"

FAN = 16  # candidate thresholds per pass
THRESHOLD_BLOCK = 256  # probabilities per chunk of a pass: a [FAN, 256] tile
# Each row's search cut into THRESHOLD_SPLIT slices, a program each, a launch per pass (9 in
# all); one program per row (split 1) walks the row 8 times and leaves most SMs idle for
# few rows. 16 warps hide that program's load latency.
THRESHOLD_SPLIT = 32
THRESHOLD_WARPS = 16
SPLIT_WARPS = 4
CHUNK = 4096  # logits per program of the draw (128256 / 4096: 32 programs a row)
DRAW_BLOCK = 1024  # logits per iteration within a chunk (divides CHUNK)


def is_enabled(device: torch.device) -> bool:
    """Whether draw.py takes these kernels for tensors on `device`."""
    return device.type == "cuda" and HAS_TRITON and os.environ.get(ENV_SWITCH, "1") != "0"


def top_p_threshold(
    probs: torch.Tensor,
    top_p: torch.Tensor,
    passes: int | None = None,
    split: int = THRESHOLD_SPLIT,
    fan: int = FAN,
    block: int = THRESHOLD_BLOCK,
    warps: int = SPLIT_WARPS,
) -> torch.Tensor:
    """[B] int32: filters.top_p_threshold of float32 `probs` [B, V] (rows contiguous) and
    `top_p` [B]; 0 keeps every token. `split`: programs per row (1, or a power of two).
    The float32 sums' order follows the split, so the split must not follow the batch: a
    seeded request's top-p set, and so its tokens, would depend on the rows beside it.
    `fan`, `block`, `warps`: the kernels' shape (powers of two); `passes`: for tests (the
    default pins the pattern: passes_for(fan))."""
    from . import draw_kernels  # Triton: importing it defines the kernels

    if probs.dtype != torch.float32:
        raise ValueError(f"probs must be float32, got {probs.dtype}")
    probs = _rows(probs)
    rows, vocab = probs.shape
    out = torch.empty(rows, dtype=torch.int32, device=probs.device)
    p = top_p.to(device=probs.device, dtype=torch.float32).contiguous()
    passes = passes_for(fan) if passes is None else passes
    if split == 1:
        draw_kernels.top_p_kernel[(rows,)](
            probs,
            p,
            out,
            vocab,
            probs.stride(0),
            FAN=fan,
            PASSES=passes,
            BLOCK=block,
            num_warps=THRESHOLD_WARPS,
        )
        return out
    bounds = torch.empty(passes, rows, 2, dtype=torch.int32, device=probs.device)
    partial = torch.empty(passes, rows, split, fan, dtype=torch.float32, device=probs.device)
    slice_len = -(-vocab // (split * block)) * block
    for pass_index in range(passes):
        draw_kernels.top_p_split_pass_kernel[(rows, split)](
            probs, p, bounds, partial, vocab, probs.stride(0), rows, slice_len, pass_index,
            SPLIT=split, FAN=fan, BLOCK=block, num_warps=warps,
        )  # fmt: skip
    draw_kernels.top_p_split_finish_kernel[(rows,)](p, bounds, partial, out, rows, passes - 1, SPLIT=split, FAN=fan)
    return out


def passes_for(fan: int) -> int:
    """Passes of a fan-ary search that pin one of the 0x3F800001 patterns in [0, 1.0]."""
    passes, width = 0, 0x3F800001
    while width > 1:
        width = -(-width // fan)
        passes += 1
    return passes


def draw_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    floors: torch.Tensor,
    streams: torch.Tensor,
    is_greedy: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B] int64: draw.draw_reference's tokens (argmax over logits >= floor of
    logit / T - log E, E noise.exponential's variate for `streams` [B] int64); the argmax of
    the logits (NaN as -inf) for a greedy row (`is_greedy` [B], nonzero) and for a row with a
    NaN or +inf logit or no finite logit at or above its floor. `logits` [B, V] float32 or
    bfloat16; `temperature`, `floors` [B] float32."""
    from . import draw_kernels  # Triton: importing it defines the kernels

    logits = _rows(logits)
    rows, vocab = logits.shape
    chunks = -(-vocab // CHUNK)
    device = logits.device
    best, fallback_best = (torch.empty(rows, chunks, dtype=torch.float32, device=device) for _ in range(2))
    where, fallback_where = (torch.empty(rows, chunks, dtype=torch.int64, device=device) for _ in range(2))
    state = torch.empty(rows, chunks, dtype=torch.int32, device=device)
    tokens = torch.empty(rows, dtype=torch.int64, device=device)
    if is_greedy is None:
        is_greedy = torch.zeros(rows, dtype=torch.int64, device=device)
    draw_kernels.draw_chunk_kernel[(rows, chunks)](
        logits,
        temperature.to(torch.float32).contiguous(),
        floors.to(torch.float32).contiguous(),
        is_greedy.contiguous(),
        streams.contiguous(),
        best,
        where,
        fallback_best,
        fallback_where,
        state,
        vocab,
        logits.stride(0),
        chunks,
        CHUNK=CHUNK,
        BLOCK=DRAW_BLOCK,
        num_warps=4,
    )
    pad = max(2, 1 << (chunks - 1).bit_length())
    draw_kernels.pick_kernel[(rows,)](
        best, where, fallback_best, fallback_where, state, tokens, chunks, CHUNKS_PAD=pad, num_warps=1
    )
    return tokens


def count_at_least(values: torch.Tensor, floors: torch.Tensor) -> torch.Tensor:
    """[B] int64: per row, how many of `values` [B, V] float32 are >= its floor [B]; one read
    of the row (the torch form writes a [B, V] mask first, six times the time)."""
    from . import draw_kernels  # Triton: importing it defines the kernels

    values = _rows(values)
    rows, vocab = values.shape
    out = torch.empty(rows, dtype=torch.int64, device=values.device)
    draw_kernels.count_at_least_kernel[(rows,)](
        values, floors.to(values.dtype).contiguous(), out, vocab, values.stride(0), BLOCK=1024, num_warps=8
    )
    return out


def noise_streams(
    seed_keys: torch.Tensor,
    is_seeded: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    engine_key: int,
    draw_base: int,
) -> torch.Tensor:
    """[B] int64: draw.noise_streams in one launch (the torch form is some forty small
    kernels, each a launch the host pays for). Inputs [B] int64; `draw_base` the int64
    added to the unseeded rows' slots."""
    from . import draw_kernels  # Triton: importing it defines the kernels

    rows = slots.shape[0]
    out = torch.empty(rows, dtype=torch.int64, device=slots.device)
    block = 256
    draw_kernels.streams_kernel[(-(-rows // block),)](
        seed_keys.contiguous(),
        is_seeded.contiguous(),
        positions.contiguous(),
        slots.contiguous(),
        out,
        engine_key,
        draw_base,
        rows,
        BLOCK=block,
    )
    return out


def uniform_bits(streams: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, vocab] int32: the kernels' integer noise, the top UNIFORM_BITS bits of the hash
    (noise.uniform's before its conversion to float): for tests."""
    from . import draw_kernels  # Triton: importing it defines the kernels

    out = torch.empty(streams.shape[0], vocab, dtype=torch.int32, device=streams.device)
    draw_kernels.bits_kernel[(streams.shape[0], -(-vocab // DRAW_BLOCK))](
        streams.contiguous(), out, vocab, BLOCK=DRAW_BLOCK
    )
    return out


def _rows(values: torch.Tensor) -> torch.Tensor:
    if values.dim() != 2 or values.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"expected [rows, vocab] float32 or bfloat16, got {tuple(values.shape)} {values.dtype}")
    return values if values.stride(1) == 1 else values.contiguous()
