"""Rank 0 of a tensor-parallel engine: the runner the engine uses in place of ModelRunner
when tensor_parallel_size > 1.

Same interface as ModelRunner (it is one: ModelRunnerProtocol, execute returning a
RunnerOutput, the engine's mode, fast/fallback switching), with two differences:
before each forward the prepared batch goes to every worker, and the forward runs this
rank's shard; `kv_cache` is a ShardedKVCache that sends swaps, quantizations and pool
changes to the workers as well, so the engine's calls reach every rank's pool (all
pools share the block tables). No decode graphs here: a RunnerOutput carries logits
only, and async decode never launches.

Every rank's pool has the engine's block count, each page holding that rank's KV heads,
so the engine's kv_cache_bytes is the budget of all ranks together (1/n on each GPU).

A dead worker takes the engine down: it is noticed before each command (process
exit codes), inside a step (the collective fails when the peer's sockets close, or
after the group timeout at worst) and by a monitor thread (which aborts an NCCL
group a dead peer would otherwise leave hanging). The runner then stops the other
workers and raises TensorParallelError; every later call raises it again.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import socket
import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from ..fast_path import unavailable_reason
from ..kv.block_pool import BlockCopy, BlockLocation
from ..kv.kv_cache import ColdLayer, KVCache
from ..model.attention import paged_attention
from ..model.model_config import ModelConfig
from ..runner.model_runner import FastPathError, ModelRunner
from ..runner.runner_output import RunnerOutput
from .shard_step import meta_to, run_shard
from .sharded_model import ShardedLlamaModel, load_sharded_model
from .sharding import ShardSpec, check_divisible
from .worker import MULTICAST_OFF, WorkerSpec, fast_attention_for, worker_main

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 120.0
TIMEOUT_ENV = "INFERD_TP_TIMEOUT_S"  # collective and start-up timeout, seconds


class TensorParallelError(RuntimeError):
    """A worker died or a collective failed: the engine cannot go on (a server should
    exit so that its supervisor starts a fresh one)."""

    fatal = True


def rank_devices(device: torch.device, world_size: int) -> list[torch.device]:
    """Rank r runs on cuda:(base + r), or all ranks on the CPU."""
    if device.type == "cpu":
        return [device] * world_size
    base = device.index or 0
    visible = torch.cuda.device_count()
    if base + world_size > visible:
        raise ValueError(
            f"tensor_parallel_size={world_size} needs GPUs cuda:{base}..cuda:{base + world_size - 1}; {visible} visible"
        )
    return [torch.device("cuda", base + r) for r in range(world_size)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timeout_from_env() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{TIMEOUT_ENV} must be > 0, got {raw!r}")
    return value


class WorkerGroup:
    """The worker processes (ranks 1..n-1) and their command pipes."""

    def __init__(self, specs: list[WorkerSpec]):
        ctx = multiprocessing.get_context("spawn")
        self.specs = specs
        self.procs = []
        self.conns = []
        self.stopping = False
        for spec in specs:
            parent, child = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=worker_main, args=(spec, child), name=f"inferd-tp-rank{spec.rank}", daemon=True)
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)

    def dead(self) -> list[str]:
        return [
            f"rank {spec.rank} (pid {proc.pid}) exited with code {proc.exitcode}"
            for spec, proc in zip(self.specs, self.procs)
            if proc.exitcode is not None
        ]

    def error_reports(self) -> list[str]:
        """Tracebacks the workers sent before exiting."""
        reports = []
        for spec, conn in zip(self.specs, self.conns):
            try:
                while conn.poll(0):
                    message = pickle.loads(conn.recv_bytes())
                    if message[0] == "error":
                        reports.append(f"rank {spec.rank}:\n{message[1]}")
            except (EOFError, OSError):
                continue
        return reports

    def expect(self, tag: str, timeout_s: float) -> list:
        """Each worker's next message, which must be `tag`; fails fast if one dies."""
        payloads = []
        deadline = time.monotonic() + timeout_s
        for spec, proc, conn in zip(self.specs, self.procs, self.conns):
            while not conn.poll(0.1):
                if not proc.is_alive():
                    raise TensorParallelError(
                        f"tensor-parallel worker rank {spec.rank} exited with code {proc.exitcode} while starting"
                    )
                if time.monotonic() > deadline:
                    raise TensorParallelError(
                        f"tensor-parallel worker rank {spec.rank} sent no {tag!r} within {timeout_s:.0f} s"
                    )
            try:
                message = pickle.loads(conn.recv_bytes())
            except EOFError:
                raise TensorParallelError(f"tensor-parallel worker rank {spec.rank} closed its pipe") from None
            if message[0] == "error":
                raise TensorParallelError(f"tensor-parallel worker rank {spec.rank} failed:\n{message[1]}")
            if message[0] != tag:
                raise TensorParallelError(
                    f"tensor-parallel worker rank {spec.rank} sent {message[0]!r}, expected {tag!r}"
                )
            payloads.append(message[1])
        return payloads

    def send(self, command: tuple) -> None:
        data = pickle.dumps(command)
        for spec, conn in zip(self.specs, self.conns):
            try:
                conn.send_bytes(data)
            except OSError as exc:
                raise TensorParallelError(f"tensor-parallel worker rank {spec.rank} is gone ({exc})") from None

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stopping = True
        for proc, conn in zip(self.procs, self.conns):
            if proc.is_alive():
                try:
                    conn.send_bytes(pickle.dumps(("shutdown",)))
                except OSError:
                    pass
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        for conn in self.conns:
            conn.close()


class ShardedKVCache:
    """Rank 0's KV pool; the operations that change pools are sent to every rank too,
    the ones that read it are rank 0's."""

    def __init__(self, local: KVCache, send: Callable[[tuple], None]):
        self.local = local
        self._send = send
        self.shape, self.dtype, self.device = local.shape, local.dtype, local.device

    @property
    def num_blocks(self) -> int:
        return self.local.num_blocks

    @property
    def num_host_blocks(self) -> int:
        return self.local.num_host_blocks  # resize_host changes it

    def has_kind(self, kind: str) -> bool:
        return self.local.has_kind(kind)

    def layer_views(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, ColdLayer | None]:
        return self.local.layer_views(layer)

    def swap(self, swap_out: list[BlockCopy], swap_in: list[BlockCopy]) -> None:
        if not swap_out and not swap_in:
            return
        self._send(("swap", swap_out, swap_in))
        self.local.swap(swap_out, swap_in)

    def quantize(self, pairs: list[tuple[int, BlockLocation]]) -> None:
        if pairs:
            self._send(("quantize", pairs))
            self.local.quantize(pairs)

    def enable_kind(self, kind: str) -> None:
        self._send(("enable_kind", kind))
        self.local.enable_kind(kind)

    def resize_host(self, num_blocks: int, keep: dict[BlockLocation, BlockLocation]) -> None:
        self._send(("resize_host", num_blocks, keep))
        self.local.resize_host(num_blocks, keep)


def _shutdown(group: WorkerGroup, owns_process_group: list[bool]) -> None:
    group.stop()
    if owns_process_group[0] and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as exc:  # a failed group may not tear down cleanly
            log.warning("destroying the tensor-parallel process group: %s", exc)
        owns_process_group[0] = False


class TPRunner(ModelRunner):
    model: ShardedLlamaModel  # rank 0's shard

    def __init__(
        self,
        model_dir: str,
        model_config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        world_size: int,
        num_blocks: int,
        num_host_blocks: int,
        block_size: int,
        current_mode: Callable[[], str],
        host_numa_node: int | None,
        cold_kinds: tuple[str, ...] = (),
        pages=None,
        timeout_s: float | None = None,
    ):
        if world_size < 2:
            raise ValueError(f"TPRunner needs tensor_parallel_size >= 2, got {world_size}")
        check_divisible(model_config, world_size)
        if dist.is_initialized():
            raise RuntimeError(
                "a torch.distributed process group already exists in this process; "
                "one tensor-parallel engine per process"
            )
        timeout_s = timeout_s if timeout_s is not None else timeout_from_env()
        devices = rank_devices(device, world_size)
        os.environ.update(MULTICAST_OFF)  # rank 0 joins the same NCCL communicator; workers inherit it too
        if device.type == "cuda":
            torch.cuda.set_device(devices[0])
        init_method = f"tcp://127.0.0.1:{free_port()}"
        dtype_name = str(dtype).removeprefix("torch.")
        specs = [
            WorkerSpec(
                rank=r,
                world_size=world_size,
                model_dir=str(model_dir),
                dtype=dtype_name,
                device=str(devices[r]) if devices[r].type == "cuda" else "cpu",
                init_method=init_method,
                timeout_s=timeout_s,
                num_blocks=num_blocks,
                num_host_blocks=num_host_blocks,
                block_size=block_size,
                cold_kinds=tuple(cold_kinds),
                num_threads=torch.get_num_threads(),
                log_level=logging.getLogger().getEffectiveLevel(),
            )
            for r in range(1, world_size)
        ]
        self.timeout_s = timeout_s
        self.failure: str | None = None
        self.workers = WorkerGroup(specs)
        self._owns_pg = [False]
        self._finalizer = weakref.finalize(self, _shutdown, self.workers, self._owns_pg)
        try:
            self.workers.expect("hello", timeout_s)
            dist.init_process_group(
                "nccl" if device.type == "cuda" else "gloo",
                init_method=init_method,
                rank=0,
                world_size=world_size,
                timeout=timedelta(seconds=timeout_s),
            )
            self._owns_pg[0] = True
            model = load_sharded_model(model_dir, dtype, devices[0], ShardSpec(0, world_size))
            cfg = model.config
            local = KVCache(
                cfg.num_hidden_layers,
                num_blocks,
                num_host_blocks,
                block_size,
                cfg.num_key_value_heads,
                cfg.head_dim,
                dtype,
                devices[0],
                host_numa_node,
                cold_kinds=tuple(cold_kinds),
            )
            self.worker_info = self.workers.expect("ready", timeout_s)
        except BaseException:
            self._finalizer()
            raise
        # ShardedKVCache has KVCache's interface (forwarded to every rank) but is no subclass;
        # ModelRunner's parameter names the class
        super().__init__(
            model,
            ShardedKVCache(local, self._send),  # type: ignore[arg-type]
            block_size,
            current_mode,
            fast_attention=fast_attention_for(devices[0], dtype),
            pages=pages,
        )
        self.world_size = world_size
        # Triton attention where available; the decode graphs (FastDecoder) are single-rank
        # code and are not attached, so every TP step runs the eager forward.
        self.fast_path_unavailable = unavailable_reason(devices[0], dtype)
        self._monitor = threading.Thread(target=self._watch_workers, name="inferd-tp-monitor", daemon=True)
        self._monitor.start()
        log.info(
            "tensor parallel: %d ranks on %s (%s), workers %s",
            world_size,
            ", ".join(map(str, devices)),
            "nccl" if device.type == "cuda" else "gloo",
            ", ".join(f"rank {i['rank']} pid {i['pid']} node {i['numa_node']}" for i in self.worker_info),
        )

    # --- failure handling -----------------------------------------------------------
    def _watch_workers(self) -> None:
        sentinels = [p.sentinel for p in self.workers.procs]
        ready = multiprocessing.connection.wait(sentinels)
        if self.workers.stopping:
            return
        for proc in self.workers.procs:
            if proc.sentinel in ready:
                proc.join(1.0)  # reap it, so its exit code is known
        dead = self.workers.dead()
        log.error("tensor-parallel worker died: %s", "; ".join(dead) or "unknown")
        if self.failure is None:
            self.failure = f"worker died: {'; '.join(dead)}"
        if self.device.type == "cuda":  # NCCL would wait for the dead peer until its timeout
            try:
                dist.distributed_c10d._abort_process_group()
            except Exception as exc:  # best effort: the timeout still ends the wait
                log.warning("could not abort the NCCL group: %s", exc)

    def _fail(self, reason: str) -> TensorParallelError:
        if self.failure is None:
            self.failure = reason
        time.sleep(0.2)  # let a dying worker's exit code and last report arrive
        details = [d for d in self.workers.dead() + self.workers.error_reports() if d not in self.failure]
        self.shutdown()
        message = f"tensor-parallel engine is down: {self.failure}"
        if details:
            message += "\n" + "\n".join(dict.fromkeys(details))
        return TensorParallelError(message)

    def _check(self) -> None:
        if self.failure is not None or self.workers.dead():
            raise self._fail(self.failure or f"worker died: {'; '.join(self.workers.dead())}")

    def _send(self, command: tuple) -> None:
        self._check()
        try:
            self.workers.send(command)
        except TensorParallelError as exc:
            raise self._fail(str(exc)) from None

    def shutdown(self) -> None:
        """Stop the workers and leave the process group (idempotent)."""
        self._finalizer()

    # --- the step ---------------------------------------------------------------------
    def prepare(self, batch):
        """Inputs built on the host (they travel to the workers from there), then moved."""
        device, self.device = self.device, torch.device("cpu")
        try:
            input_ids, meta, sample_rows = super().prepare(batch)
        finally:
            self.device = device
        self._host_inputs = (input_ids, meta)
        return input_ids.to(device), meta_to(meta, device), sample_rows

    # Only a FastPathError switches to the fallback: any other failure has left the ranks
    # out of step and ends the engine.
    fast_path_errors = (FastPathError,)

    @torch.inference_mode()
    def execute(self, batch) -> RunnerOutput:
        """As ModelRunner.execute, logits only (no decode graphs here)."""
        self._check()
        return self._forward_batch(batch, self.mode == "fast")

    def _forward(self, input_ids, meta, sample_rows, attention_fn, check: bool) -> torch.Tensor:
        host_ids, host_meta = self._host_inputs
        attention = "portable" if attention_fn is paged_attention else "fast"
        self._send(("step", host_ids, host_meta, sample_rows, attention))
        try:
            logits, failed_somewhere, error = run_shard(
                self.model, input_ids, meta, self.kv_layers, attention_fn, sample_rows
            )
        except Exception as exc:  # a collective failed: a peer died or timed out
            raise self._fail(f"{type(exc).__name__} in a step: {exc}") from exc
        if error is not None:
            raise error if isinstance(error, FastPathError) else FastPathError(type(error).__name__, str(error))
        if failed_somewhere:
            raise FastPathError("tp_worker", "the fast path failed on another tensor-parallel rank")
        if logits is None:
            logits = input_ids.new_zeros(0, 0, dtype=torch.float32)
        if check and logits.numel() and not torch.isfinite(logits).all():
            raise FastPathError("non_finite_logits", "non-finite logits on the fast path")
        return logits

    # --- benchmarks and tests -----------------------------------------------------------
    def probe_workers(self) -> list[dict]:
        """Each worker's pid, device, NUMA node, CPUs and multicast environment."""
        self._send(("probe",))
        return self.workers.expect("probe", self.timeout_s)
