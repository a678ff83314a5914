"""Tensor parallelism across the GPUs of one host (gloo processes on CPU)."""

from .sharding import ShardSpec, check_divisible, local_config, shard_tensor, split_dim
from .tp_runner import TensorParallelError, TPRunner

__all__ = [
    "ShardSpec",
    "TPRunner",
    "TensorParallelError",
    "check_divisible",
    "local_config",
    "shard_tensor",
    "split_dim",
]
