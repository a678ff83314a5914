"""A tensor-parallel worker: one process per rank > 0, started with multiprocessing spawn.

Commands come from rank 0 over a pipe, not through a collective: an idle engine would
otherwise leave the workers waiting in a broadcast past the group's timeout, and a
pipe reads EOF the moment rank 0 dies, so a worker never outlives its engine. Only
the forward itself uses torch.distributed (gloo on CPU, NCCL on CUDA), so its
collectives are always bounded by one step. Messages are plain pickles (send_bytes):
Connection.send would move tensors through shared memory, slow at one message a step.

Commands: ("step", input_ids, meta, sample_rows, attention), ("swap", out, in),
("quantize", pairs), ("enable_kind", kind), ("resize_host", num_blocks, keep),
("probe",), ("shutdown",). Replies (to start-up and probe only): ("hello", pid),
("ready", info), ("probe", info), ("error", traceback).
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from ..fast_path import unavailable_reason
from ..kv.kv_cache import KVCache
from ..memory import numa_memory
from ..model.attention import paged_attention
from .shard_step import meta_to, run_shard
from .sharded_model import load_sharded_model
from .sharding import ShardSpec

# NVLink multicast (NVLS) stays off on every rank; set before NCCL can read them.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    rank: int
    world_size: int
    model_dir: str
    dtype: str  # torch dtype name: float32, bfloat16, float16
    device: str  # cpu or cuda:N
    init_method: str  # tcp://host:port of rank 0's store
    timeout_s: float
    num_blocks: int
    num_host_blocks: int
    block_size: int
    cold_kinds: tuple[str, ...] = ()
    num_threads: int = 1
    log_level: int = logging.INFO
    sysfs_root: str = "/sys"
    extra_env: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.rank < self.world_size:
            raise ValueError(f"worker rank must be in [1, {self.world_size}), got {self.rank}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda:")):
            raise ValueError(f"device must be cpu or cuda:N, got {self.device!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.num_blocks < 1 or self.num_host_blocks < 0:
            raise ValueError(
                f"num_blocks must be >= 1 and num_host_blocks >= 0, got {self.num_blocks}, {self.num_host_blocks}"
            )


def node_cpus(node: int, sysfs_root: str = "/sys") -> set[int]:
    return set(numa_memory.parse_cpulist(Path(sysfs_root, f"devices/system/node/node{node}/cpulist").read_text()))


def bind_to_device_node(device, sysfs_root: str = "/sys") -> int | None:
    """Run this process on the CPUs of `device`'s NUMA node and prefer its memory.
    CPU devices keep the inherited binding (the agent's placement). Returns the node
    the host KV pool should use."""
    node = numa_memory.device_numa_node(device, sysfs_root)
    if device.type != "cuda" or node is None:
        return node
    try:
        os.sched_setaffinity(0, node_cpus(node, sysfs_root))
    except (OSError, ValueError) as exc:  # a cpuset may forbid the node's CPUs
        log.warning("could not bind to the CPUs of NUMA node %d: %s", node, exc)
    if not numa_memory._set_mempolicy(numa_memory.MPOL_PREFERRED, node):
        log.warning("could not set a memory policy for NUMA node %d", node)
    return node


class Worker:
    def __init__(self, spec: WorkerSpec, conn):
        import torch
        import torch.distributed as dist

        self.spec, self.conn = spec, conn
        torch.set_num_threads(spec.num_threads)
        self.device = torch.device(spec.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.numa_node = bind_to_device_node(self.device, spec.sysfs_root)
        dist.init_process_group(
            "nccl" if self.device.type == "cuda" else "gloo",
            init_method=spec.init_method,
            rank=spec.rank,
            world_size=spec.world_size,
            timeout=timedelta(seconds=spec.timeout_s),
        )
        dtype = getattr(torch, spec.dtype)
        self.model = load_sharded_model(spec.model_dir, dtype, self.device, ShardSpec(spec.rank, spec.world_size))
        cfg = self.model.config  # this rank's shapes
        self.kv_cache = KVCache(
            cfg.num_hidden_layers,
            spec.num_blocks,
            spec.num_host_blocks,
            spec.block_size,
            cfg.num_key_value_heads,
            cfg.head_dim,
            dtype,
            self.device,
            self.numa_node,
            cold_kinds=tuple(spec.cold_kinds),
        )
        self.refresh_kv_views()
        self.portable_attention = paged_attention
        self.fast_attention = fast_attention_for(self.device, dtype)

    def refresh_kv_views(self) -> None:
        self.kv_layers = [self.kv_cache.layer_views(i) for i in range(self.model.config.num_hidden_layers)]

    def info(self) -> dict:
        return {
            "rank": self.spec.rank,
            "pid": os.getpid(),
            "device": str(self.device),
            "numa_node": self.numa_node,
            "cpus": sorted(os.sched_getaffinity(0)),
            "env": {name: os.environ.get(name) for name in MULTICAST_OFF},
            "num_kv_heads": self.model.config.num_key_value_heads,
        }

    def send(self, message) -> None:
        self.conn.send_bytes(pickle.dumps(message))

    def serve(self) -> None:
        import torch.distributed as dist

        self.send(("ready", self.info()))
        while True:
            try:
                command = pickle.loads(self.conn.recv_bytes())
            except EOFError:
                log.error("rank 0 went away; worker rank %d exits", self.spec.rank)
                return
            op = command[0]
            if op == "shutdown":
                dist.destroy_process_group()
                return
            self.handle(op, command[1:])

    def handle(self, op: str, args: tuple) -> None:
        import torch

        if op == "step":
            input_ids, meta, sample_rows, attention = args
            fn = self.fast_attention if attention == "fast" else self.portable_attention
            with torch.inference_mode():
                run_shard(
                    self.model, input_ids.to(self.device), meta_to(meta, self.device), self.kv_layers, fn, sample_rows
                )
        elif op == "swap":
            self.kv_cache.swap(*args)
        elif op == "quantize":
            self.kv_cache.quantize(*args)
        elif op == "enable_kind":
            self.kv_cache.enable_kind(*args)
            self.refresh_kv_views()
        elif op == "resize_host":
            self.kv_cache.resize_host(*args)
        elif op == "probe":
            self.send(("probe", self.info()))
        else:
            raise ValueError(f"unknown tensor-parallel command {op!r}")


def fast_attention_for(device, dtype):
    """Triton paged attention where this device runs it, else the portable path."""
    if unavailable_reason(device, dtype) is not None:
        return paged_attention
    from ..fast_path.attention import triton_paged_attention  # Triton kernels: only where they run

    return triton_paged_attention


def worker_main(spec: WorkerSpec, conn) -> None:
    """Entry point of a spawned worker process."""
    os.environ.update(MULTICAST_OFF)
    os.environ.update(spec.extra_env)
    logging.basicConfig(level=spec.log_level, format=f"tp-rank{spec.rank} %(levelname)s %(name)s: %(message)s")
    try:
        conn.send_bytes(pickle.dumps(("hello", os.getpid())))
        Worker(spec, conn).serve()
    except Exception:  # reported to rank 0, then this rank exits
        tb = traceback.format_exc()
        log.error("worker rank %d failed:\n%s", spec.rank, tb)
        try:
            conn.send_bytes(pickle.dumps(("error", tb)))
        except OSError:
            pass
        sys.exit(1)
