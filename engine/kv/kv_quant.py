"""Cold-KV quantizers: int8 with one scale per (block, kv head), int4 with group scales.

Both are symmetric (zero maps to zero, no offsets to store):
- int8: q = round(x / s), s = max|x| / 127 over one block's tokens and head dims of
  one kv head; |x - q s| <= s / 2.
- int4: groups of INT4_GROUP_SIZE (128, or the whole head when head_dim is smaller or
  not a multiple) consecutive head dimensions of one token and head share a float16
  scale s = max|x| / 7 (for head_dim 128: 2 bytes of scale per 64 bytes of data); q in [-7, 7] is stored offset by 8 as a nibble,
  two per byte (even dimension in the low nibble). |x - q s| <= s / 2 (plus the
  float16 rounding of s).
Dequantization is elementwise and runs on the gathered blocks inside attention; the
cache itself is never rewritten in full precision.
"""

from __future__ import annotations

import torch

INT4_GROUP_SIZE = 128


def int4_group_size(head_dim: int) -> int:
    return INT4_GROUP_SIZE if head_dim % INT4_GROUP_SIZE == 0 else head_dim


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., bs, kvh, hd] -> (int8 same shape, float32 scales [..., kvh])."""
    amax = x.float().abs().amax(dim=(-3, -1))  # [..., kvh]
    scale = (amax / 127.0).clamp_min(1e-12)
    q = torch.round(x.float() / scale.unsqueeze(-2).unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale.unsqueeze(-2).unsqueeze(-1)).to(dtype)


def quantize_int4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., hd] -> (uint8 [..., hd/2], float16 scales [..., hd/group])."""
    hd = x.shape[-1]
    g = int4_group_size(hd)
    groups = x.float().reshape(*x.shape[:-1], hd // g, g)
    scale = (groups.abs().amax(dim=-1) / 7.0).clamp_min(1e-6).to(torch.float16)
    q = torch.round(groups / scale.float().unsqueeze(-1)).clamp_(-7, 7).to(torch.int16) + 8
    q = q.reshape(*x.shape[:-1], hd).to(torch.uint8)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)
    return packed, scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    low = (packed & 0x0F).to(torch.int16) - 8
    high = (packed >> 4).to(torch.int16) - 8
    q = torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    hd = q.shape[-1]
    g = hd // scale.shape[-1]
    out = q.float().reshape(*q.shape[:-1], hd // g, g) * scale.float().unsqueeze(-1)
    return out.reshape(*q.shape).to(dtype)
