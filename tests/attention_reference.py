"""Paged decode attention in float64, one query token a row: what the Triton decode
kernels are checked against (tests/test_fast_path.py, tests/test_fast_path_shapes.py)."""

from __future__ import annotations

import torch


def reference_attention(q, k_cache, v_cache, tables, ctx, scale, window=None):
    """q [B, heads, dim] over each row's first ctx[b] cached tokens (block table tables[b]),
    GQA by repeating KV heads; `window`: only the last `window` tokens."""
    batch, heads, dim = q.shape
    bs, kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(batch, heads, dim, dtype=torch.float64)
    for b in range(batch):
        n = int(ctx[b])
        if n == 0:
            continue
        pages = tables[b, : (n + bs - 1) // bs].long()
        k = k_cache[pages].reshape(-1, kv_heads, dim)[:n].double().repeat_interleave(heads // kv_heads, 1)
        v = v_cache[pages].reshape(-1, kv_heads, dim)[:n].double().repeat_interleave(heads // kv_heads, 1)
        first = max(0, n - window) if window else 0
        s = torch.einsum("hd,thd->ht", q[b].double(), k[first:]) * scale
        out[b] = torch.einsum("ht,thd->hd", s.softmax(-1), v[first:])
    return out
