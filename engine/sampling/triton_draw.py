"""The draw's two costly parts as Triton kernels: the top-p threshold and the noise argmax.

Same answers as the torch code beside them (filters.top_p_threshold, noise.exponential
with draw.py's argmax), which stays the CPU path and the tests' oracle; draw.py takes these
on CUDA unless INFERD_TRITON_SAMPLING=0, read at each call so that one process can
compare both paths.

- top_p_threshold: the largest float32 bit pattern t with mass(probs whose bits >= t) >= p,
  one program per row. The torch code halves [lo, hi) 30 times, one pass over the row
  each; here each pass tests FAN = 16 evenly spaced candidates at once (a [FAN, BLOCK]
  compare and masked sum per chunk of the row) and narrows [lo, hi) 16-fold, so
  TOP_P_PASSES = 8 passes pin the pattern (16^8 > 0x3F800001 patterns in [0, 1.0]). The
  invariant mass(>= lo) >= p holds throughout (lo starts at 0, as in the torch code), and
  no candidate at or above hi is tested. The float32 sums run in another order than
  torch's, so a set whose mass lies within rounding of p may gain or lose its last token.
- draw_tokens: argmax_j p_j / E_j with E_j noise.exponential's variate, in one pass over
  the row: the splitmix64 hash in uint64 arithmetic inside the kernel (no [B, V] int64
  temporaries), the row cut into CHUNK-wide programs and the chunks' winners picked by a
  second kernel (lowest index on ties, as torch.argmax). The integer noise bits equal
  noise.uniform's; the kernel's log may differ from torch's in the last ulp, which moves
  only a near-tie. A row with nothing to draw from (a non-finite probability, or none
  positive) gets -1, for the caller's fallback.
"""

from __future__ import annotations

import importlib.util
import os

import torch

# fast_path/availability.has_triton's check, inlined: engine.fast_path imports this package.
HAS_TRITON = importlib.util.find_spec("triton") is not None
ENV_SWITCH = "INFERD_TRITON_SAMPLING"

FAN = 16  # candidate thresholds per pass
TOP_P_PASSES = 8  # ceil-divisions of 0x3F800001 by FAN down to one pattern
THRESHOLD_BLOCK = 256  # probabilities per chunk of a pass: a [FAN, 256] tile
CHUNK = 4096  # probabilities per program of the draw (128256 / 4096: 32 programs a row)
DRAW_BLOCK = 1024  # probabilities per iteration within a chunk (divides CHUNK)


def is_enabled(device: torch.device) -> bool:
    """Whether draw.py takes these kernels for tensors on `device`."""
    return device.type == "cuda" and HAS_TRITON and os.environ.get(ENV_SWITCH, "1") != "0"


def top_p_threshold(probs: torch.Tensor, top_p: torch.Tensor, passes: int = TOP_P_PASSES) -> torch.Tensor:
    """[B] int32: filters.top_p_threshold of float32 `probs` [B, V] (rows contiguous) and
    `top_p` [B]; 0 keeps every token. `passes`: for tests (fewer cannot pin the pattern)."""
    from . import draw_kernels

    probs = _rows(probs)
    rows, vocab = probs.shape
    out = torch.empty(rows, dtype=torch.int32, device=probs.device)
    p = top_p.to(device=probs.device, dtype=torch.float32).contiguous()
    draw_kernels.top_p_kernel[(rows,)](
        probs, p, out, vocab, probs.stride(0), FAN=FAN, PASSES=passes, BLOCK=THRESHOLD_BLOCK, num_warps=4
    )
    return out


def draw_tokens(probs: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """[B] int64: argmax_j probs[i, j] / E_ij with noise.exponential's E for `streams` [B]
    int64; -1 for a row with a non-finite probability or none positive. `probs` [B, V]
    float32: filtered (zero outside the kept set), not renormalised."""
    from . import draw_kernels

    probs = _rows(probs)
    rows, vocab = probs.shape
    chunks = -(-vocab // CHUNK)
    best = torch.empty(rows, chunks, dtype=torch.float32, device=probs.device)
    where = torch.empty(rows, chunks, dtype=torch.int64, device=probs.device)
    state = torch.empty(rows, chunks, dtype=torch.int32, device=probs.device)
    tokens = torch.empty(rows, dtype=torch.int64, device=probs.device)
    draw_kernels.draw_chunk_kernel[(rows, chunks)](
        probs,
        streams.contiguous(),
        best,
        where,
        state,
        vocab,
        probs.stride(0),
        chunks,
        CHUNK=CHUNK,
        BLOCK=DRAW_BLOCK,
        num_warps=4,
    )
    draw_kernels.pick_kernel[(rows,)](
        best, where, state, tokens, chunks, CHUNKS_PAD=max(2, 1 << (chunks - 1).bit_length()), num_warps=1
    )
    return tokens


def uniform_bits(streams: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, vocab] int32: the kernels' integer noise, the top UNIFORM_BITS bits of the hash
    (noise.uniform's before its conversion to float): for tests."""
    from . import draw_kernels

    out = torch.empty(streams.shape[0], vocab, dtype=torch.int32, device=streams.device)
    draw_kernels.bits_kernel[(streams.shape[0], -(-vocab // DRAW_BLOCK))](
        streams.contiguous(), out, vocab, BLOCK=DRAW_BLOCK
    )
    return out


def _rows(probs: torch.Tensor) -> torch.Tensor:
    if probs.dim() != 2 or probs.dtype != torch.float32:
        raise ValueError(f"probs must be [rows, vocab] float32, got {tuple(probs.shape)} {probs.dtype}")
    return probs if probs.stride(1) == 1 else probs.contiguous()
