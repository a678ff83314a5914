"""Fused small ops of the decode step, in Triton, with their torch references.

Each kernel reproduces the portable model's rounding steps (engine/model/model.py, which
follows Hugging Face): values are rounded to the activation dtype exactly where the
eager code rounds them, so the fast path's tokens stay close to the portable path's.

- `add_rms_norm`: residual += x (in place), then RMSNorm of the new residual; one pass.
- `silu_and_mul`: [T, 2I] (gate | up, from one fused matmul) -> silu(gate) * up.
- `rope_and_cache`: rotary embedding of q (in place) and k, and the K/V write into the
  paged cache at `slots`; slot -1 (a padded CUDA-graph row) writes nothing.

The `*_reference` functions are the same maths in torch: the CPU tests' oracle and
the candidates for `torch.compile` in the benchmark that picks the faster variant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .availability import has_triton
from .launch_shape import cdiv, next_power_of_2
from .pdl import pdl_launch

Q_HEADS_PER_PROGRAM = 8

if has_triton():
    import triton
    import triton.language as tl

    from .pdl import wait_for_previous

    @triton.jit
    def _add_rms_norm_kernel(
        x_ptr,
        res_ptr,
        w_ptr,
        out_ptr,
        stride_x,
        stride_r,
        stride_o,
        hidden,
        eps,
        HAS_RESIDUAL: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
            x = (x + r).to(res_ptr.dtype.element_ty)
            tl.store(res_ptr + row * stride_r + cols, x, mask=mask)
            x = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / hidden + eps)
        normed = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_o + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, inter, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inter
        gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + row * stride_o + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def rope_cos_sin(pos_ptr, inv_freq_ptr, j, ty: tl.constexpr):
        """cos and sin of the token at pos_ptr for frequency indices j, rounded to ty as
        the eager model's cached tables are (returned in fp32)."""
        freqs = tl.load(pos_ptr).to(tl.float32) * tl.load(inv_freq_ptr + j)
        return tl.cos(freqs).to(ty).to(tl.float32), tl.sin(freqs).to(ty).to(tl.float32)

    @triton.jit
    def rotate_pair(x1, x2, cos, sin, ty: tl.constexpr):
        """x * cos + rotate_half(x) * sin for the halves x1, x2 (fp32), rounded like the
        eager bf16 ops; returns both halves in ty."""
        a1 = (x1 * cos).to(ty).to(tl.float32)
        b1 = (-x2 * sin).to(ty).to(tl.float32)
        a2 = (x2 * cos).to(ty).to(tl.float32)
        b2 = (x1 * sin).to(ty).to(tl.float32)
        return (a1 + b1).to(ty), (a2 + b2).to(ty)

    @triton.jit
    def _rotate(
        x_ptr, base, stride_h, heads, cos, sin, HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr
    ):
        """Rotate-half RoPE of `heads` rows at x_ptr + base; returns both halves, rounded.
        HALF_PAD: HALF up to a power of two (a head dim of 80 or 96), the padding masked."""
        h = tl.arange(0, HEADS_PAD)
        j = tl.arange(0, HALF_PAD)
        mask = h[:, None] < heads
        if HALF_PAD != HALF:
            mask = mask & (j[None, :] < HALF)
        ptr = x_ptr + base + h[:, None] * stride_h + j[None, :]
        x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
        r1, r2 = rotate_pair(x1, x2, cos[None, :], sin[None, :], x_ptr.dtype.element_ty)
        return r1, r2, h, j, mask

    @triton.jit
    def _rope_and_cache_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        pos_ptr,
        inv_freq_ptr,
        slot_ptr,
        kc_ptr,
        vc_ptr,
        stride_qt,
        stride_qh,
        stride_kt,
        stride_kh,
        stride_vt,
        stride_vh,
        stride_cb,
        stride_ct,
        stride_ch,
        num_heads,
        num_kv_heads,
        BLOCK_SIZE: tl.constexpr,
        Q_HEADS_PER_PROGRAM: tl.constexpr,
        KV_HEADS_PAD: tl.constexpr,
        HALF: tl.constexpr,
        HALF_PAD: tl.constexpr,
        USE_PDL: tl.constexpr,
    ):
        """Program (t, 0): token t's K rotation and K/V cache write; program (t, c > 0):
        rotation of q heads [(c - 1) * Q_HEADS_PER_PROGRAM, c * Q_HEADS_PER_PROGRAM)."""
        wait_for_previous(USE_PDL)
        t = tl.program_id(0)
        part = tl.program_id(1)
        if HALF_PAD == HALF:
            freq_index = tl.arange(0, HALF)
        else:  # padded frequencies repeat the last one: loads stay in bounds, stores are masked
            freq_index = tl.minimum(tl.arange(0, HALF_PAD), HALF - 1)
        cos, sin = rope_cos_sin(pos_ptr + t, inv_freq_ptr, freq_index, q_ptr.dtype.element_ty)
        if part > 0:
            first = (part - 1) * Q_HEADS_PER_PROGRAM
            base = t * stride_qt + first * stride_qh
            q1, q2, h, jj, hmask = _rotate(
                q_ptr, base, stride_qh, num_heads - first, cos, sin, Q_HEADS_PER_PROGRAM, HALF, HALF_PAD
            )
            qptr = q_ptr + base + h[:, None] * stride_qh + jj[None, :]
            tl.store(qptr, q1, mask=hmask)
            tl.store(qptr + HALF, q2, mask=hmask)
        else:
            slot = tl.load(slot_ptr + t)
            if slot >= 0:
                k1, k2, kh, kj, kmask = _rotate(
                    k_ptr, t * stride_kt, stride_kh, num_kv_heads, cos, sin, KV_HEADS_PAD, HALF, HALF_PAD
                )
                slot = slot.to(tl.int64)
                cache = (
                    (slot // BLOCK_SIZE) * stride_cb
                    + (slot % BLOCK_SIZE) * stride_ct
                    + kh[:, None] * stride_ch
                    + kj[None, :]
                )
                tl.store(kc_ptr + cache, k1.to(kc_ptr.dtype.element_ty), mask=kmask)
                tl.store(kc_ptr + cache + HALF, k2.to(kc_ptr.dtype.element_ty), mask=kmask)
                vsrc = v_ptr + t * stride_vt + kh[:, None] * stride_vh + kj[None, :]
                tl.store(vc_ptr + cache, tl.load(vsrc, mask=kmask, other=0.0).to(vc_ptr.dtype.element_ty), mask=kmask)
                tl.store(
                    vc_ptr + cache + HALF,
                    tl.load(vsrc + HALF, mask=kmask, other=0.0).to(vc_ptr.dtype.element_ty),
                    mask=kmask,
                )


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(residual + x), residual + x); the sum is written into `residual` in place.
    Without a residual the input itself is the new residual."""
    rows, hidden = x.shape
    out = torch.empty_like(x)
    _add_rms_norm_kernel[(rows,)](
        x,
        residual if residual is not None else x,
        weight,
        out,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        hidden,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=next_power_of_2(hidden),
    )
    return out, residual if residual is not None else x


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    rows, width = gate_up.shape
    inter = width // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_and_mul_kernel[(rows, cdiv(inter, block))](gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=block)
    return out


def rope_and_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """q: [T, H, D], k/v: [T, KVH, D] (views are fine); caches [blocks, block_size, KVH, D]."""
    tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("K and V caches must share strides with a contiguous head dimension")
    per_program = min(Q_HEADS_PER_PROGRAM, next_power_of_2(heads))
    # One program per (token, part): at batch 1 a single program per token was latency-bound.
    _rope_and_cache_kernel[(tokens, 1 + cdiv(heads, per_program))](
        q,
        k,
        v,
        positions,
        inv_freq,
        slots,
        k_cache,
        v_cache,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        heads,
        kv_heads,
        BLOCK_SIZE=k_cache.shape[1],
        Q_HEADS_PER_PROGRAM=per_program,
        KV_HEADS_PAD=next_power_of_2(kv_heads),
        HALF=head_dim // 2,
        HALF_PAD=next_power_of_2(head_dim // 2),
        **pdl_launch(q.device),
    )


# --- torch references (CPU oracle; torch.compile candidates) -------------------------
def add_rms_norm_reference(x, residual, weight, eps):
    if residual is not None:
        residual.add_(x)
        x = residual
    normed = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * normed, x


def silu_and_mul_reference(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_and_cache_reference(q, k, v, positions, inv_freq, k_cache, v_cache, slots):
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(q.dtype)[:, None, :], emb.sin().to(q.dtype)[:, None, :]

    def rotate(x):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    q.copy_(rotate(q))
    keep = slots >= 0
    pages, offsets = slots[keep] // k_cache.shape[1], slots[keep] % k_cache.shape[1]
    k_cache[pages, offsets] = rotate(k)[keep].to(k_cache.dtype)
    v_cache[pages, offsets] = v[keep].to(v_cache.dtype)
