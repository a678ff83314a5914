"""Deterministic mode's steps on a GPU the fast path runs on (engine/batch_invariant.py).

The torch steps of BatchInvariantOps keep a row's result independent of the batch by
running every norm and elementwise step over fixed tiles of 256 rows, the last padded:
a batch of one pays for 256 rows, a few dozen launches a layer. The fast path's fused
kernels (fast_path/fused_ops.py) need no tiles: each program handles one row (RMSNorm
with the residual add, SiLU-and-multiply) or one token's heads (RoPE and the K/V write),
with a launch shape set by the model's widths alone, so a row is computed by the same
program code whatever else is in the step. The projections stay the invariant matmul,
over the fast path's fused q/k/v and gate/up weights (one launch each instead of three
and two; each output column is still the same fixed walk over K).

Rounding differs from the torch steps (the kernels follow the fast path, which follows
the portable model to rounding), so a GPU's deterministic outputs differ from a CPU's;
within one device they are bitwise the same alone and in any batch.
"""

from __future__ import annotations

import torch

from .fast_path.fast_decoder import fuse_projections
from .fast_path.fused_ops import add_rms_norm, rope_and_cache, silu_and_mul
from .fast_path.invariant_matmul import invariant_linear
from .model import DecoderLayer, LayerOps, LlamaModel


class FusedInvariantOps(LayerOps):
    """LayerOps for deterministic mode on the GPU: fused row kernels for the norms, RoPE
    and SiLU, the invariant matmul for every projection (see the module docstring)."""

    def __init__(self, model: LlamaModel, positions: torch.Tensor, slots: torch.Tensor, attend):
        super().__init__(model, positions, slots, attend)
        fuse_projections(model)
        cfg = model.config
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.eps = cfg.rms_norm_eps
        self.inv_freq = model.rotary.inv_freq.float().contiguous()

    def attention_input(self, layer: DecoderLayer, x, residual, kv) -> tuple[torch.Tensor, torch.Tensor]:
        h_q, h_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        hidden, residual = add_rms_norm(x, residual, layer.input_layernorm.weight, self.eps)
        fused = layer.fused_projections
        qkv = invariant_linear(hidden, fused["qkv"], fused["qkv_bias"])
        tokens = qkv.shape[0]
        q = qkv[:, : h_q * d].view(tokens, h_q, d)
        k = qkv[:, h_q * d : (h_q + h_kv) * d].view(tokens, h_kv, d)
        v = qkv[:, (h_q + h_kv) * d :].view(tokens, h_kv, d)
        rope_and_cache(q, k, v, self.positions, self.inv_freq, kv[0], kv[1], self.slots)
        return q, residual

    def attention_output(self, layer: DecoderLayer, out: torch.Tensor) -> torch.Tensor:
        return invariant_linear(out.reshape(out.shape[0], -1), layer.self_attn.o_proj.weight)

    def mlp(self, layer: DecoderLayer, x, residual) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = add_rms_norm(x, residual, layer.post_attention_layernorm.weight, self.eps)
        act = silu_and_mul(invariant_linear(hidden, layer.fused_projections["gate_up"]))
        return invariant_linear(act, layer.mlp.down_proj.weight), residual

    def final_norm(self, x, residual) -> torch.Tensor:
        hidden, _ = add_rms_norm(x, residual, self.model.norm.weight, self.eps)
        return hidden
