"""How each weight is split across the ranks of a tensor-parallel group, and a loader
that reads only one rank's slices from the safetensors files.

For rank r of n (Megatron-style):
- q/k/v projections (and their biases): column-parallel by heads; rank r keeps query
  heads [r H/n, (r+1) H/n) and KV heads [r K/n, (r+1) K/n), so each query head's GQA
  group stays on the rank holding its KV head;
- gate/up projections: column-parallel by the MLP's inner dimension;
- o_proj and down_proj: row-parallel (their input columns split the same way), so the
  ranks' outputs are partial sums, added by one all-reduce each;
- embedding and LM head: split by vocabulary rows (a masked lookup plus an all-reduce,
  logits gathered to rank 0);
- norms: replicated.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ..model.loader import safetensors_files
from ..model.model_config import ModelConfig

# (pattern, split dimension); names absent here are replicated.
SPLIT_RULES: tuple[tuple[re.Pattern, int], ...] = (
    (re.compile(r"\.self_attn\.[qkv]_proj\.(weight|bias)$"), 0),
    (re.compile(r"\.mlp\.(gate|up)_proj\.weight$"), 0),
    (re.compile(r"\.self_attn\.o_proj\.weight$"), 1),
    (re.compile(r"\.mlp\.down_proj\.weight$"), 1),
    (re.compile(r"(^|\.)embed_tokens\.weight$"), 0),
    (re.compile(r"^lm_head\.weight$"), 0),
)


def split_dim(name: str) -> int | None:
    """The dimension `name` is split along, or None when every rank holds it whole."""
    for pattern, dim in SPLIT_RULES:
        if pattern.search(name):
            return dim
    return None


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """Rank `rank` of a group of `world_size`."""

    rank: int
    world_size: int

    def __post_init__(self) -> None:
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or not 1 <= self.world_size <= 8:
            raise ValueError(f"world_size must be an integer in [1, 8], got {self.world_size!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank!r}")

    def bounds(self, size: int) -> tuple[int, int]:
        part = size // self.world_size
        return self.rank * part, (self.rank + 1) * part


def check_divisible(cfg: ModelConfig, world_size: int) -> None:
    """ValueError naming every dimension `world_size` does not divide."""
    dims = {
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
    }
    bad = [f"{name}={value}" for name, value in dims.items() if value % world_size]
    if bad:
        raise ValueError(f"tensor_parallel_size={world_size} must divide {', '.join(bad)} of the model")


def local_config(cfg: ModelConfig, world_size: int) -> ModelConfig:
    """The per-rank shapes: a LlamaModel built from it has exactly one rank's parameters."""
    check_divisible(cfg, world_size)
    return dataclasses.replace(
        cfg,
        num_attention_heads=cfg.num_attention_heads // world_size,
        num_key_value_heads=cfg.num_key_value_heads // world_size,
        intermediate_size=cfg.intermediate_size // world_size,
        vocab_size=cfg.vocab_size // world_size,
    )


def shard_tensor(name: str, tensor: torch.Tensor, spec: ShardSpec) -> torch.Tensor:
    """Rank `spec.rank`'s slice of a full checkpoint tensor (a view)."""
    dim = split_dim(name)
    if dim is None or spec.world_size == 1:
        return tensor
    size = tensor.shape[dim]
    if size % spec.world_size:
        raise ValueError(f"{name}: dimension {dim} of size {size} is not divisible by {spec.world_size}")
    lo, hi = spec.bounds(size)
    return tensor.narrow(dim, lo, hi - lo)


def read_shards(model_dir: str | Path, names: set[str], spec: ShardSpec, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """This rank's slices of `names` (checkpoint names), read with safetensors slicing so
    a rank reads only its own bytes of each split weight."""
    out: dict[str, torch.Tensor] = {}
    for path in safetensors_files(Path(model_dir)):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name not in names:
                    continue
                view = f.get_slice(name)
                shape = view.get_shape()
                dim = split_dim(name)
                if dim is None or spec.world_size == 1:
                    tensor = view[:]
                else:
                    if shape[dim] % spec.world_size:
                        raise ValueError(
                            f"{name}: dimension {dim} of size {shape[dim]} in {path.name} "
                            f"is not divisible by {spec.world_size}"
                        )
                    lo, hi = spec.bounds(shape[dim])
                    tensor = view[lo:hi] if dim == 0 else view[:, lo:hi]
                out[name] = tensor.to(dtype=dtype)
    return out
