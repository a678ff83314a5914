"""Counter-based noise: an Exp(1) variate per (key, counter, token id), from integer
tensor ops on any device, with no generator state.

A row's noise is a pure function of its key and counter: a seeded request uses (its
seed, its output position), so its tokens depend on its logits alone, not on the batch,
the rows beside it or the device; an unseeded row uses a key mixed from the engine's
seed, the draw's number and the row's slot. The hash is splitmix64's finaliser (Steele,
Lea and Flood), in int64 ops: torch's int64 multiply wraps as uint64's does, and the
right shifts are made logical with a mask.

Precision: a uniform variate takes the hash's top 24 bits, u = (h + 1/2) / 2^24, so
E = -log(u) lies in [2^-25, 17.3]; a token's chance to be drawn is exact up to that 2^-24
quantisation of u. In float32, h + 1/2 rounds to an even integer above 2^23, so the top
h gives u = 1 and E = -0: E is floored at MIN_EXPONENTIAL (that u's true -log), since p / -0
is NaN for a filtered-out token (p = 0) and torch.argmax takes NaN as the maximum.
"""

from __future__ import annotations

import torch

_GOLDEN = -0x61C8864680B583EB  # 0x9E3779B97F4A7C15 as a signed int64
_MIX1 = -0x40A7B892E31B1A47  # 0xBF58476D1CE4E5B9
_MIX2 = -0x6B2FB644ECCEEE15  # 0x94D049BB133111EB
UNIFORM_BITS = 24
MIN_EXPONENTIAL = 2.0**-25  # -log(1 - 2^-25), the top hash's E


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's >> is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser: a bijection of 64-bit values that scatters every input bit."""
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def row_streams(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """[B] int64: one stream id per (key, counter) pair."""
    return mix64(mix64(keys + _GOLDEN) + counters)


def uniform(streams: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, vocab] float32 in (0, 1): token j of row i from hash(streams[i], j)."""
    tokens = torch.arange(vocab, dtype=torch.int64, device=streams.device)
    bits = _shift_right(mix64(streams[:, None] + tokens[None, :] * _GOLDEN), 64 - UNIFORM_BITS)
    return (bits.to(torch.float32) + 0.5) * (1.0 / (1 << UNIFORM_BITS))


def exponential(streams: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, vocab] float32 Exp(1) variates (see `uniform`), all positive."""
    return torch.log(uniform(streams, vocab)).neg_().clamp_(min=MIN_EXPONENTIAL)
