"""The fast path's specialisation of the model's one forward (engine/model/model.py,
LlamaModel.run): fused ops, Triton paged attention, fused QKV and gate/up matmuls;
the decode step shaped for CUDA-graph capture.

It runs the engine's own `LlamaModel` weights. `fuse_projections` concatenates each
layer's q/k/v and gate/up weights into one tensor and points the original modules'
parameters at slices of it, so the portable path still sees the same weights (no
second copy), while the fast path does one matmul where the eager model does three
(and two). `FusedOps` are the forward's steps with those matmuls and the fused small
ops; `Batch1Ops` specialise them for one token: each RMSNorm folded into the GEMV after
it, RoPE and the K/V write into the q/k/v GEMV, SiLU-and-multiply into the gate/up GEMV
(triton_gemv.py); `RowsOps` do the same for 2-64 rows with tensor-core tiles
(triton_rows.py). With cold KV, rows whose oldest blocks are quantized attend through
the two-run cold kernel (attention/cold_prefix.py). Every input of the decode step is a
tensor of fixed shape: nothing here reads a tensor back to the host, so the whole step
can be captured and replayed.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import sdpa_kernel

from ..model.attention import AttentionMetadata
from ..model.model import DecoderLayer, FusedProjections, LayerOps, LlamaModel
from .attention import (
    INT4,
    INT8,
    SDPA_BACKENDS,
    cold_kernels_take,
    cold_prefix_decode_attention,
    large_pack_queries,
    paged_chunk_attention,
    paged_decode_attention,
    rows_per_pack,
)
from .fused_ops import add_rms_norm, rope_and_cache, silu_and_mul
from .triton_gemv import choose_config, gemv, rms_norm_gemv, rms_norm_qkv_rope
from .triton_rows import MAX_ROWS, ROW_COUNTS, qkv_pairs, rows_gemm, rows_qkv_rope
from .triton_rows import choose_config as choose_rows_config


def _slices_of(parts: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    fused = torch.cat(parts, dim=0)
    views: list[torch.Tensor] = []
    start = 0
    for p in parts:
        views.append(fused[start : start + p.shape[0]])
        start += p.shape[0]
    return fused, views


@torch.no_grad()
def fuse_projections(model: LlamaModel) -> list[FusedProjections]:
    """Per layer: {'qkv', 'qkv_bias', 'gate_up'} fused tensors (also the layer's
    `fused_projections`); the modules' weights become views into them (values
    unchanged). Idempotent per model."""
    cached: list[FusedProjections] | None = getattr(model, "_fused_projections", None)
    if cached is not None:
        return cached
    fused = []
    for layer in model.layers:
        assert isinstance(layer, DecoderLayer)  # a ModuleList yields plain Modules to mypy
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
        layer.fused_projections = {"qkv": qkv, "qkv_bias": qkv_bias, "gate_up": gate_up}
        fused.append(layer.fused_projections)
    model._fused_projections = fused
    return fused


class FusedOps(LayerOps):
    """The forward's steps with the fused projections and fused_ops.py's kernels (any
    number of tokens: prefill, mixed and decode steps)."""

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

    @staticmethod
    def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x W^T (+ bias): every projection of these steps (cuBLAS here)."""
        return F.linear(x, weight, bias)

    def attention_input(self, layer: DecoderLayer, x, residual, kv):
        h_q, h_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        hidden, residual = add_rms_norm(x, residual, layer.input_layernorm.weight, self.eps)
        fused = layer.fused_projections
        qkv = self.project(hidden, fused["qkv"], fused["qkv_bias"])
        tokens = qkv.shape[0]
        q = qkv[:, : h_q * d].view(tokens, h_q, d)
        k = qkv[:, h_q * d : (h_q + h_kv) * d].view(tokens, h_kv, d)
        v = qkv[:, (h_q + h_kv) * d :].view(tokens, h_kv, d)
        rope_and_cache(q, k, v, self.positions, self.inv_freq, kv[0], kv[1], self.slots)
        return q, residual

    def attention_output(self, layer: DecoderLayer, out: torch.Tensor) -> torch.Tensor:
        return self.project(out.reshape(out.shape[0], -1), layer.self_attn.o_proj.weight)

    def mlp(self, layer: DecoderLayer, x, residual):
        hidden, residual = add_rms_norm(x, residual, layer.post_attention_layernorm.weight, self.eps)
        act = silu_and_mul(self.project(hidden, layer.fused_projections["gate_up"]))
        return self.project(act, layer.mlp.down_proj.weight), residual

    def final_norm(self, x, residual) -> torch.Tensor:
        hidden, _ = add_rms_norm(x, residual, self.model.norm.weight, self.eps)
        return hidden


class Batch1Ops(FusedOps):
    """FusedOps for one token: four kernels per layer besides attention instead of
    about ten (triton_gemv.py), the last RMSNorm folded into the LM head's GEMV."""

    def attention_input(self, layer: DecoderLayer, x, residual, kv):
        h_q, h_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv, residual = rms_norm_qkv_rope(
            x,
            residual,
            layer.input_layernorm.weight,
            self.eps,
            layer.fused_projections["qkv"],
            h_q,
            h_kv,
            self.positions,
            self.inv_freq,
            kv[0],
            kv[1],
            self.slots,
        )
        return qkv[:, : h_q * d].view(1, h_q, d), residual

    def attention_output(self, layer: DecoderLayer, out: torch.Tensor) -> torch.Tensor:
        return gemv(out.reshape(1, -1), layer.self_attn.o_proj.weight)

    def mlp(self, layer: DecoderLayer, x, residual):
        act, residual = rms_norm_gemv(
            x,
            residual,
            layer.post_attention_layernorm.weight,
            self.eps,
            layer.fused_projections["gate_up"],
            silu_mul=True,
        )
        return gemv(act, layer.mlp.down_proj.weight), residual

    def logits(self, x, residual) -> torch.Tensor:
        logits, _ = rms_norm_gemv(
            x, residual, self.model.norm.weight, self.eps, self.model.lm_head.weight, out_dtype=torch.float32
        )
        return logits


class RowsOps(FusedOps):
    """FusedOps for 2-64 rows (a decode step, or a short prefill chunk's rows): the
    products through triton_rows.py, RoPE and the K/V write folded into the q/k/v
    product and SiLU-and-multiply into the gate/up one; seven kernels a layer instead
    of nine."""

    def attention_input(self, layer: DecoderLayer, x, residual, kv):
        h_q, d = self.num_heads, self.head_dim
        hidden, residual = add_rms_norm(x, residual, layer.input_layernorm.weight, self.eps)
        qkv = rows_qkv_rope(
            hidden,
            layer.fused_projections["qkv"],
            h_q,
            self.num_kv_heads,
            self.positions,
            self.inv_freq,
            kv[0],
            kv[1],
            self.slots,
        )
        return qkv[:, : h_q * d].view(qkv.shape[0], h_q, d), residual

    def attention_output(self, layer: DecoderLayer, out: torch.Tensor) -> torch.Tensor:
        return _product(out.reshape(out.shape[0], -1), layer.self_attn.o_proj.weight)

    def mlp(self, layer: DecoderLayer, x, residual):
        hidden, residual = add_rms_norm(x, residual, layer.post_attention_layernorm.weight, self.eps)
        act = rows_gemm(hidden, layer.fused_projections["gate_up"], silu_mul=True)
        return _product(act, layer.mlp.down_proj.weight), residual

    def logits(self, x, residual) -> torch.Tensor:
        return _product(self.final_norm(x, residual), self.model.lm_head.weight).float()


def _product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x W^T through the row kernel, or through cuBLAS where that measured faster."""
    config = choose_rows_config(weight.shape[0], x.shape[1], x.shape[0])
    return rows_gemm(x, weight, config=config) if config is not None else F.linear(x, weight)


class FastDecoder:
    """The model's forward with FusedOps: `forward` is the decode step (one token per
    row, fixed-shape inputs, logits [B, vocab] float32; what the CUDA graphs capture;
    Batch1Ops for one row); `forward_step` runs prefill and mixed steps eagerly."""

    def __init__(self, model: LlamaModel, kv_layers: list[tuple]):
        cfg = model.config
        self.model = model
        self.set_kv_layers(kv_layers)
        self.fused = fuse_projections(model)
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.sliding_window = cfg.sliding_window
        self.scale = self.head_dim**-0.5
        self.batch1_gemv = self._batch1_gemv_available()
        self.rows_gemm = self._rows_gemm_available()

    def _batch1_gemv_available(self) -> bool:
        """Batch-1 decode through the fused GEMVs (Batch1Ops): on unless
        INFERD_BATCH1_GEMV=0, for models without q/k/v biases whose every projection
        has a launch shape (and the q/k/v one whole RoPE pairs per program)."""
        if os.environ.get("INFERD_BATCH1_GEMV", "1") == "0" or self.fused[0]["qkv_bias"] is not None:
            return False
        weights = self._projection_weights()
        configs = [choose_config(*w.shape) for w in weights]
        if not all(w.stride(1) == 1 and c is not None for w, c in zip(weights, configs)):
            return False
        qkv_config = configs[0]
        assert qkv_config is not None  # every config is, checked above
        pairs = qkv_config.block_n // 2
        return pairs > 0 and (self.head_dim // 2) % pairs == 0

    def _projection_weights(self) -> tuple[torch.Tensor, ...]:
        layer = self.model.layers[0]
        assert isinstance(layer, DecoderLayer)  # a ModuleList yields plain Modules to mypy
        return (
            self.fused[0]["qkv"],
            layer.self_attn.o_proj.weight,
            self.fused[0]["gate_up"],
            layer.mlp.down_proj.weight,
            self.model.lm_head.weight,
        )

    def _rows_gemm_available(self) -> bool:
        """Decode steps of 2-64 rows through the row kernels (RowsOps): on unless
        INFERD_ROWS_GEMM=0, for models without q/k/v biases whose projections have
        contiguous rows, whose q/k/v and gate/up products (the fused epilogues, which have
        no cuBLAS twin) have a launch shape at every row count, and whose head dim splits
        into whole dots of rotating pairs."""
        if os.environ.get("INFERD_ROWS_GEMM", "1") == "0" or self.fused[0]["qkv_bias"] is not None:
            return False
        weights = self._projection_weights()
        if not all(w.stride(1) == 1 for w in weights):
            return False
        qkv, gate_up = weights[0], weights[2]
        for m in ROW_COUNTS:
            qkv_config = choose_rows_config(qkv.shape[0], qkv.shape[1], m)
            if qkv_config is None or choose_rows_config(gate_up.shape[0], gate_up.shape[1], m) is None:
                return False
            if not qkv_pairs(self.head_dim, qkv_config):
                return False
        return True

    def ops_for(self, rows: int) -> type[FusedOps]:
        """The layer ops of a decode step of `rows` rows."""
        if rows == 1 and self.batch1_gemv:
            return Batch1Ops
        if 2 <= rows <= MAX_ROWS and self.rows_gemm:
            return RowsOps
        return FusedOps

    def set_kv_layers(self, kv_layers: list[tuple]) -> None:
        """Per layer (k_cache, v_cache) or (k_cache, v_cache, ColdLayer | None)."""
        self.kv_layers = [(kv[0], kv[1], kv[2] if len(kv) > 2 else None) for kv in kv_layers]

    def chunk_rows_per_pack(self) -> int:
        """Rows of a prefill chunk's pack on the decode graphs (attention/chunk_rows.py);
        1 (no packs) with a sliding window, which that kernel does not apply."""
        return 1 if self.sliding_window else rows_per_pack(self.num_heads, self.num_kv_heads)

    def chunk_large_rows_per_pack(self) -> int:
        """Rows of a pack on the larger chunk graphs (cuda_graphs.LARGE_PACK_MIN_ROWS): as
        many as fill LARGE_PACK_QUERIES queries, or fewer where one split of each of them
        would not fit a round of the split merge (a head dim above 128)."""
        queries = large_pack_queries(self.head_dim)
        return 1 if self.sliding_window else rows_per_pack(self.num_heads, self.num_kv_heads, queries)

    def cold_kinds(self) -> tuple[int, ...]:
        """Kind codes of the cold blocks this KV cache can hold (1 int8, 2 int4) that the
        cold kernels take (none at a head dim they do not: attention/common.cold_kernels_take)."""
        cold = self.kv_layers[0][2] if self.kv_layers else None
        if cold is None or not cold_kernels_take(self.head_dim):
            return ()
        return tuple(code for code, scales in ((INT8, cold.scales8_k), (INT4, cold.scales4_k)) if scales is not None)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        num_splits: int,
        cold_kind: int = 0,
        block_slots: torch.Tensor | None = None,
        cold_blocks: torch.Tensor | None = None,
        rows_per_pack: int = 1,
    ) -> torch.Tensor:
        """Logits of a decode step. cold_kind 0: every block is hot. Otherwise each row's
        first cold_blocks[b] table entries are cold blocks of that kind (pages in
        block_tables, slots in block_slots), the rest hot. rows_per_pack > 1 (hot blocks
        only): the rows are packs of that many rows of one sequence (a prefill chunk's,
        attention/chunk_rows.py)."""

        def attend(q, kv):
            k_cache, v_cache, cold = kv
            if rows_per_pack > 1:
                assert not cold_kind and not self.sliding_window  # DecodeGraphs packs hot rows without windows only
                return paged_chunk_attention(
                    q, k_cache, v_cache, block_tables, context_lens, self.scale, num_splits, rows_per_pack
                )
            if cold_kind:
                return cold_prefix_decode_attention(
                    q,
                    k_cache,
                    v_cache,
                    cold,
                    block_tables,
                    block_slots,
                    cold_blocks,
                    cold_kind,
                    context_lens,
                    self.scale,
                    num_splits,
                    self.sliding_window,
                )
            return paged_decode_attention(
                q,
                k_cache,
                v_cache,
                block_tables,
                context_lens,
                self.scale,
                num_splits,
                self.sliding_window,
                inputs_ready=True,
            )  # the step's inputs

        step = self.ops_for(input_ids.shape[0])(self.model, positions, slots, attend)
        return step.logits(*self.model.run(step, input_ids, self.kv_layers))

    @torch.inference_mode()
    def forward_step(self, input_ids: torch.Tensor, meta: AttentionMetadata, attention_fn) -> torch.Tensor:
        """Final hidden states [T, hidden] of any step (prefill, mixed, decode) with
        FusedOps; `attention_fn` has `paged_attention`'s signature. Its SDPA calls take
        attention/prefill.py's backends, chosen once for the step's every layer."""
        with sdpa_kernel(SDPA_BACKENDS):
            return self.model(input_ids, meta, self.kv_layers, attention_fn, ops=FusedOps)
