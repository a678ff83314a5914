"""Llama-family decoder (Llama, Mistral, Qwen2) over the paged KV cache.

Numerics follow Hugging Face transformers' implementation (RMSNorm in float32,
rotate-half RoPE with inv_freq in float32, llama3 frequency scaling), so float32
outputs match it to rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypedDict

import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttentionMetadata, paged_attention, write_kv
from .model_config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv_freq
    # llama3: long wavelengths slowed by `factor`, short kept, a smooth blend between.
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_len / low_freq_factor
    high_freq_wavelen = old_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    inv_freq: torch.Tensor  # a buffer, registered in __init__

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; cos/sin: [T, D]."""
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim**-0.5
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)


class FusedProjections(TypedDict):
    """A layer's fused projection weights (fast_path/fast_decoder.py's
    fuse_projections): q/k/v and gate/up concatenated along the output dimension."""

    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    gate_up: torch.Tensor


class DecoderLayer(nn.Module):
    fused_projections: FusedProjections  # set only once the fast path fuses the layer

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LayerOps:
    """The steps of the forward (LlamaModel.run) over the residual stream, in torch on
    the model's own modules: the portable path. The fast path specialises these steps
    (fast_path/fast_decoder.py: fused ops, and GEMVs for one token); the order of the
    steps and the residual bookkeeping stay here.

    The stream is (x, residual): `x` is the last sub-layer's output, not yet added to
    `residual` (None before the first layer). Each norm step adds it first, in the
    activation dtype, so the sums and their rounding are those of `x = x + f(norm(x))`.
    `attend(q, kv)` is the step's attention over one layer's (k_cache, v_cache, cold)."""

    def __init__(self, model: LlamaModel, positions: torch.Tensor, slots: torch.Tensor, attend):
        self.model = model
        self.positions, self.slots, self.attend = positions, slots, attend
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    @staticmethod
    def add(x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        return x if residual is None else residual + x

    def attention_input(self, layer: DecoderLayer, x, residual, kv) -> tuple[torch.Tensor, torch.Tensor]:
        """(q [T, heads, D] with RoPE, new residual); k and v written into the cache."""
        residual = self.add(x, residual)
        h = layer.input_layernorm(residual)
        attn = layer.self_attn
        t = h.shape[0]
        q = attn.q_proj(h).view(t, attn.num_heads, attn.head_dim)
        k = attn.k_proj(h).view(t, attn.num_kv_heads, attn.head_dim)
        v = attn.v_proj(h).view(t, attn.num_kv_heads, attn.head_dim)
        if self._rope is None:  # once per forward: every layer rotates the same positions
            self._rope = self.model.rotary(self.positions, h.dtype)
        cos, sin = self._rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        write_kv(kv[0], kv[1], k, v, self.slots)
        return q, residual

    def attention_output(self, layer: DecoderLayer, out: torch.Tensor) -> torch.Tensor:
        return layer.self_attn.o_proj(out.reshape(out.shape[0], -1))

    def mlp(self, layer: DecoderLayer, x, residual) -> tuple[torch.Tensor, torch.Tensor]:
        residual = self.add(x, residual)
        h = layer.post_attention_layernorm(residual)
        mlp = layer.mlp
        return mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h)), residual

    def final_norm(self, x, residual) -> torch.Tensor:
        return self.model.norm(self.add(x, residual))

    def logits(self, x, residual) -> torch.Tensor:
        return self.model.compute_logits(self.final_norm(x, residual))


class LlamaModel(nn.Module):
    """Weights are named as in Hugging Face checkpoints (model.layers.N..., lm_head)."""

    _fused_projections: list[FusedProjections]  # set only once the fast path fuses the model
    # What forward() runs unless told otherwise; deterministic mode (runner/batch_invariant.py)
    # replaces all three with its batch-invariant steps.
    step_ops: type[LayerOps] = LayerOps
    attention_override: Callable[..., torch.Tensor] | None = None
    lm_head_fn: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def run(
        self, ops: LayerOps, input_ids: torch.Tensor, kv_caches: list[tuple]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The forward: every path's layer loop; returns the residual stream (x, residual)
        after the last layer, for `ops.final_norm` or `ops.logits`."""
        x, residual = ops.embed(input_ids), None
        for layer, kv in zip(self.layers, kv_caches):  # kv: (k_cache, v_cache, cold views or None)
            assert isinstance(layer, DecoderLayer)  # a ModuleList yields plain Modules to mypy
            q, residual = ops.attention_input(layer, x, residual, kv)
            x = ops.attention_output(layer, ops.attend(q, kv))
            x, residual = ops.mlp(layer, x, residual)
        return x, residual

    def forward(
        self,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple],
        attention_fn=paged_attention,
        ops: type[LayerOps] | None = None,
    ) -> torch.Tensor:
        """Returns the final hidden states [T, hidden]. `ops`: the steps' implementation
        (`step_ops`, or the fast path's fused one), built for this step."""
        scale = self.config.head_dim**-0.5
        attention_fn = self.attention_override or attention_fn

        def attend(q, kv):
            k_cache, v_cache, cold = kv
            if cold is not None:  # the arena holds cold pages: attention must know
                return attention_fn(q, k_cache, v_cache, meta, scale, cold=cold)
            return attention_fn(q, k_cache, v_cache, meta, scale)

        step = (ops or self.step_ops)(self, meta.positions, meta.slot_mapping, attend)
        return step.final_norm(*self.run(step, input_ids, kv_caches))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return (self.lm_head_fn or self.lm_head)(hidden).float()
