"""The Llama-family model of engine/model/model.py, one rank's shard of it.

Built from the per-rank config (sharding.local_config), so every module already has
one rank's shapes and parameter names match the checkpoint's; three modules are
swapped for their parallel forms: o_proj and down_proj all-reduce their partial
sums, the embedding looks up only its own vocabulary rows and all-reduces, and the
LM head's logits are gathered to rank 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..model.model import DecoderLayer, LlamaModel, rope_inv_freq
from ..model.model_config import ModelConfig
from .sharding import ShardSpec, local_config, read_shards


@dataclass(slots=True)
class CollectiveTimer:
    """Time spent in this rank's collectives (only while `enabled`: it synchronises)."""

    enabled: bool = False
    seconds: float = 0.0
    count: int = 0

    def run(self, fn, tensor: torch.Tensor, *args, **kwargs):
        if not self.enabled:
            return fn(tensor, *args, **kwargs)
        _sync(tensor.device)
        start = time.perf_counter()
        result = fn(tensor, *args, **kwargs)
        _sync(tensor.device)
        self.seconds += time.perf_counter() - start
        self.count += 1
        return result

    def reset(self) -> None:
        self.seconds, self.count = 0.0, 0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RowParallelLinear(nn.Linear):
    """A Linear over this rank's input columns; the all-reduce adds the ranks' partials."""

    timer: CollectiveTimer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        self.timer.run(dist.all_reduce, out)
        return out


class VocabParallelEmbedding(nn.Embedding):
    """Rows [start, start + local vocab) of the table; other ids read zeros, then the
    all-reduce puts every token's row together (one rank adds a value, the rest zeros:
    exact in any dtype)."""

    vocab_start: int
    timer: CollectiveTimer

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside[:, None], 0)
        self.timer.run(dist.all_reduce, out)
        return out


def _retype(module: nn.Module, cls: type, **attrs) -> None:
    module.__class__ = cls  # same parameters and names, parallel forward
    for name, value in attrs.items():
        setattr(module, name, value)


class ShardedLlamaModel(LlamaModel):
    def __init__(self, cfg: ModelConfig, spec: ShardSpec):
        super().__init__(local_config(cfg, spec.world_size))
        self.full_config = cfg
        self.spec = spec
        self.timer = CollectiveTimer()
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)  # a ModuleList yields plain Modules to mypy
            _retype(layer.self_attn.o_proj, RowParallelLinear, timer=self.timer)
            _retype(layer.mlp.down_proj, RowParallelLinear, timer=self.timer)
        vocab_start, _ = spec.bounds(cfg.vocab_size)
        _retype(self.embed_tokens, VocabParallelEmbedding, vocab_start=vocab_start, timer=self.timer)

    # None on ranks > 0 narrows LlamaModel's contract; only run_shard, which knows, calls it here
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:  # type: ignore[override]
        """Full logits [rows, vocab] in float32 on rank 0; None on the other ranks."""
        local = self.lm_head(hidden).float().contiguous()
        parts = [torch.empty_like(local) for _ in range(self.spec.world_size)] if self.spec.rank == 0 else None
        self.timer.run(dist.gather, local, parts, dst=0)
        return torch.cat(parts, dim=-1) if parts is not None else None


def load_sharded_model(
    model_dir: str | Path, dtype: torch.dtype, device: torch.device, spec: ShardSpec
) -> ShardedLlamaModel:
    """This rank's shard, reading only its slices of the checkpoint."""
    model_dir = Path(model_dir)
    cfg = ModelConfig.from_dir(model_dir)
    with torch.device("meta"):
        model = ShardedLlamaModel(cfg, spec)
    params = dict(model.named_parameters())
    expected = {("model." + n if not n.startswith("lm_head") else n) for n in params}
    if cfg.tie_word_embeddings:
        expected.discard("lm_head.weight")
    loaded = read_shards(model_dir, expected, spec, dtype)
    missing = sorted(expected - set(loaded))
    if missing:
        raise ValueError(
            f"checkpoint {model_dir} lacks weights: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}"
        )
    state = {(n[len("model.") :] if n.startswith("model.") else n): t for n, t in loaded.items()}
    for name, tensor in state.items():
        want = tuple(params[name].shape)
        if tuple(tensor.shape) != want:
            raise ValueError(
                f"{name}: rank {spec.rank} slice has shape {tuple(tensor.shape)}, the model expects {want}"
            )
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.rotary.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
    return model.to(device).eval()
