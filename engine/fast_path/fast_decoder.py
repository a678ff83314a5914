"""The decode step of a Llama-family model on the fast path: fused ops, Triton paged
attention, fused QKV and gate/up matmuls; shaped for CUDA-graph capture.

It runs the engine's own `LlamaModel` weights. `fuse_projections` concatenates each
layer's q/k/v and gate/up weights into one tensor and points the original modules'
parameters at slices of it, so the portable path still sees the same weights (no
second copy), while the fast path does one matmul where the eager model does three
(and two). With cold KV, rows whose oldest blocks are quantized attend through the
two-run cold kernel (attention/cold_prefix.py). A batch-1 decode step runs its
projections as Triton GEMVs with the small ops folded in (`batch1_logits`,
triton_gemv.py). Every input is a tensor of fixed shape: nothing here reads a tensor
back to the host, so the whole step can be captured and replayed.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import AttentionMetadata
from ..model import LlamaModel
from .fused_ops import add_rms_norm, rope_and_cache, silu_and_mul
from .attention import INT4, INT8, cold_prefix_decode_attention, paged_decode_attention
from .triton_gemv import choose_config, gemv, rms_norm_gemv, rms_norm_qkv_rope


def _slices_of(parts: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    fused = torch.cat(parts, dim=0)
    views, start = [], 0
    for p in parts:
        views.append(fused[start : start + p.shape[0]])
        start += p.shape[0]
    return fused, views


@torch.no_grad()
def fuse_projections(model: LlamaModel) -> list[dict[str, torch.Tensor | None]]:
    """Per layer: {'qkv', 'qkv_bias', 'gate_up'} fused tensors; the modules' weights
    become views into them (values unchanged). Idempotent per model."""
    cached = getattr(model, "_fused_projections", None)
    if cached is not None:
        return cached
    fused = []
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        projs = (attn.q_proj, attn.k_proj, attn.v_proj)
        qkv, views = _slices_of([p.weight.data for p in projs])
        for proj, view in zip(projs, views):
            proj.weight = nn.Parameter(view, requires_grad=False)
        qkv_bias = None
        if attn.q_proj.bias is not None:
            qkv_bias, bviews = _slices_of([p.bias.data for p in projs])
            for proj, view in zip(projs, bviews):
                proj.bias = nn.Parameter(view, requires_grad=False)
        gate_up, (gate, up) = _slices_of([mlp.gate_proj.weight.data, mlp.up_proj.weight.data])
        mlp.gate_proj.weight = nn.Parameter(gate, requires_grad=False)
        mlp.up_proj.weight = nn.Parameter(up, requires_grad=False)
        fused.append({"qkv": qkv, "qkv_bias": qkv_bias, "gate_up": gate_up})
    model._fused_projections = fused
    return fused


class FastDecoder:
    """The model's forward with fused ops: `forward` is the decode step (one token per
    row, fixed-shape inputs, logits [B, vocab] float32; what the CUDA graphs capture);
    `forward_step` runs prefill and mixed steps eagerly with the same fused ops."""

    def __init__(self, model: LlamaModel, kv_layers: list[tuple]):
        cfg = model.config
        self.model = model
        self.set_kv_layers(kv_layers)
        self.fused = fuse_projections(model)
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.sliding_window = cfg.sliding_window
        self.scale = self.head_dim**-0.5
        self.inv_freq = model.rotary.inv_freq.float().contiguous()
        self.batch1_gemv = self._batch1_gemv_available()

    def _batch1_gemv_available(self) -> bool:
        """Batch-1 decode through the fused GEMVs (triton_gemv.py): on unless
        INFERD_BATCH1_GEMV=0, for models without q/k/v biases whose every projection
        has a launch shape (and the q/k/v one whole RoPE pairs per program)."""
        if os.environ.get("INFERD_BATCH1_GEMV", "1") == "0" or self.fused[0]["qkv_bias"] is not None:
            return False
        layer = self.model.layers[0]
        weights = (self.fused[0]["qkv"], layer.self_attn.o_proj.weight, self.fused[0]["gate_up"],
                   layer.mlp.down_proj.weight, self.model.lm_head.weight)
        configs = [choose_config(*w.shape) for w in weights]
        if not all(w.stride(1) == 1 and c is not None for w, c in zip(weights, configs)):
            return False
        pairs = configs[0].block_n // 2
        return pairs > 0 and (self.head_dim // 2) % pairs == 0

    def set_kv_layers(self, kv_layers: list[tuple]) -> None:
        """Per layer (k_cache, v_cache) or (k_cache, v_cache, ColdLayer | None)."""
        self.kv_layers = [(kv[0], kv[1], kv[2] if len(kv) > 2 else None) for kv in kv_layers]

    def cold_kinds(self) -> tuple[int, ...]:
        """Kind codes of the cold blocks this KV cache can hold (1 int8, 2 int4)."""
        cold = self.kv_layers[0][2] if self.kv_layers else None
        if cold is None:
            return ()
        return tuple(code for code, scales in ((INT8, cold.scales8_k), (INT4, cold.scales4_k)) if scales is not None)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                block_tables: torch.Tensor, context_lens: torch.Tensor, num_splits: int, cold_kind: int = 0,
                block_slots: torch.Tensor | None = None, cold_blocks: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of a decode step. cold_kind 0: every block is hot. Otherwise each row's
        first cold_blocks[b] table entries are cold blocks of that kind (pages in
        block_tables, slots in block_slots), the rest hot."""

        def attend(q, k_cache, v_cache, cold):
            if cold_kind:
                return cold_prefix_decode_attention(q, k_cache, v_cache, cold, block_tables, block_slots, cold_blocks,
                                                    cold_kind, context_lens, self.scale, num_splits,
                                                    self.sliding_window)
            return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, self.scale, num_splits,
                                          self.sliding_window, inputs_ready=True)  # the step's inputs

        if self.batch1_gemv and input_ids.shape[0] == 1:
            return self.batch1_logits(input_ids, positions, slots, attend)
        return self.model.compute_logits(self.hidden_states(input_ids, positions, slots, attend))

    @torch.inference_mode()
    def forward_step(self, input_ids: torch.Tensor, meta: AttentionMetadata, attention_fn) -> torch.Tensor:
        """Final hidden states [T, hidden] of any step (prefill, mixed, decode) with the
        fused ops and projections; `attention_fn` has `paged_attention`'s signature."""

        def attend(q, k_cache, v_cache, cold):
            if cold is not None:
                return attention_fn(q, k_cache, v_cache, meta, self.scale, cold=cold)
            return attention_fn(q, k_cache, v_cache, meta, self.scale)

        return self.hidden_states(input_ids, meta.positions, meta.slot_mapping, attend)

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                      attend) -> torch.Tensor:
        tokens = input_ids.shape[0]
        h_q, h_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        x = self.model.embed_tokens(input_ids)
        residual = None
        for layer, fused, (k_cache, v_cache, cold) in zip(self.model.layers, self.fused, self.kv_layers):
            hidden, residual = add_rms_norm(x, residual, layer.input_layernorm.weight, self.eps)
            qkv = F.linear(hidden, fused["qkv"], fused["qkv_bias"])
            q = qkv[:, : h_q * d].view(tokens, h_q, d)
            k = qkv[:, h_q * d : (h_q + h_kv) * d].view(tokens, h_kv, d)
            v = qkv[:, (h_q + h_kv) * d :].view(tokens, h_kv, d)
            rope_and_cache(q, k, v, positions, self.inv_freq, k_cache, v_cache, slots)
            attn = attend(q, k_cache, v_cache, cold)
            x = F.linear(attn.reshape(tokens, h_q * d), layer.self_attn.o_proj.weight)
            hidden, residual = add_rms_norm(x, residual, layer.post_attention_layernorm.weight, self.eps)
            x = F.linear(silu_and_mul(F.linear(hidden, fused["gate_up"])), layer.mlp.down_proj.weight)
        hidden, _ = add_rms_norm(x, residual, self.model.norm.weight, self.eps)
        return hidden

    def batch1_logits(self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                      attend) -> torch.Tensor:
        """`hidden_states` + `compute_logits` for one token, with each RMSNorm folded
        into the GEMV after it, RoPE and the K/V write into the q/k/v GEMV and
        SiLU-and-multiply into the gate/up GEMV: four kernels per layer besides
        attention instead of about ten."""
        h_q, h_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        x = self.model.embed_tokens(input_ids)
        residual = None
        for layer, fused, (k_cache, v_cache, cold) in zip(self.model.layers, self.fused, self.kv_layers):
            qkv, residual = rms_norm_qkv_rope(x, residual, layer.input_layernorm.weight, self.eps, fused["qkv"],
                                              h_q, h_kv, positions, self.inv_freq, k_cache, v_cache, slots)
            attn = attend(qkv[:, : h_q * d].view(1, h_q, d), k_cache, v_cache, cold)
            x = gemv(attn.reshape(1, h_q * d), layer.self_attn.o_proj.weight)
            act, residual = rms_norm_gemv(x, residual, layer.post_attention_layernorm.weight, self.eps,
                                          fused["gate_up"], silu_mul=True)
            x = gemv(act, layer.mlp.down_proj.weight)
        logits, _ = rms_norm_gemv(x, residual, self.model.norm.weight, self.eps, self.model.lm_head.weight,
                                  out_dtype=torch.float32)
        return logits
