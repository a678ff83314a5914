"""Engine configuration: one validated dataclass.

Field names follow vLLM's where the meaning is the same. Every field has a
documented default and bounds; a bad value or an unknown key raises a
`ValueError` naming the field and what is allowed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferd.strict_fields import from_fields

BLOCK_SIZES = (8, 16, 32)
DTYPES = ("float32", "bfloat16", "float16", "auto")
PREEMPTION_MODES = ("swap", "recompute")
KV_COLD_DTYPES = ("none", "int8", "int4")
MODES = ("fast", "fallback")
LOAD_FORMATS = ("auto", "dummy")

# Parameters the agent may change at run time, with their bounds (inclusive).
# Enumerated ones list their allowed values instead.
TUNABLE_BOUNDS: dict[str, tuple[int, int] | tuple[str, ...]] = {
    "max_num_seqs": (1, 1024),
    "max_num_batched_tokens": (16, 1 << 20),
    "kv_cold_dtype": KV_COLD_DTYPES,
    "kv_hot_window": (0, 1 << 20),
    "swap_space_bytes": (0, 1 << 40),
    "preemption_mode": PREEMPTION_MODES,
    "mode": MODES,
}


def check_range(name: str, value: Any, low: float, high: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if value != value:  # NaN passes every comparison below
        raise ValueError(f"{name} must be a number, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")


def check_choice(name: str, value: Any, choices: tuple[object, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")


@dataclass(slots=True)
class EngineConfig:
    model: str = ""
    """Path to a local Hugging Face checkpoint directory."""
    dtype: str = "auto"
    """float32, bfloat16, float16, or auto (the checkpoint's torch_dtype; float32 on CPU)."""
    load_format: str = "auto"
    """auto (the checkpoint's safetensors) or dummy (random weights drawn on the device from the
    checkpoint's config.json, for benchmarks of large shapes; as vLLM's --load-format dummy)."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (cuda when available)."""
    seed: int = 0
    """Seed of the engine's sampling generator for requests without their own seed."""
    block_size: int = 16
    """Tokens per KV block: 8, 16 or 32."""
    kv_cache_bytes: int = 0
    """KV pool size in bytes; 0 sizes it from gpu_memory_utilization (CUDA) or 256 MiB (CPU)."""
    gpu_memory_utilization: float = 0.9
    """Share of GPU memory the engine may use for weights, activations and KV (0, 1]."""
    swap_space_bytes: int = 64 << 20
    """Host swap pool for preempted sequences' KV blocks (0 disables swap)."""
    preemption_mode: str = "swap"
    """swap or recompute; swap falls back to recompute when the host pool is full."""
    max_num_seqs: int = 64
    """Most sequences scheduled in one step [1, 1024]."""
    max_num_batched_tokens: int = 8192
    """Most tokens (prefill chunks + decodes) in one step [16, 2^20]. 8192 measured best on an H200
    for a burst of 256 x (512 prompt + 256 output): offline 10,099 against 9,029 tok/s at 2048, and a
    lower TTFT (p50 1.82 against 2.07 s; `inferd bench burst`, commit c58ae5e)."""
    max_model_len: int = 0
    """Longest prompt + output; 0 takes the model's max_position_embeddings."""
    enable_prefix_caching: bool = True
    watermark: float = 0.01
    """Share of KV blocks kept free at admission, so running sequences can grow [0, 0.5]."""
    priority_aging_steps: int = 256
    """A waiting request gains one priority level per this many steps (stops starvation)."""
    best_effort_seat_share: float = 0.25
    """With SLO classes: the share of max_num_seqs kept for best-effort requests (at least one
    seat unless 0), so deadline requests, which go first, cannot starve them [0, 1]."""
    kv_cold_dtype: str = "none"
    """Cold-KV quantization: none, int8, int4."""
    kv_hot_window: int = 128
    """Most recent tokens per sequence kept in full precision when kv_cold_dtype is set."""
    mode: str = "fast"
    """fast (custom kernels where available) or fallback (portable torch path only)."""
    async_scheduling: bool = True
    """On the fast path, launch each greedy decode step before the host has read the previous
    step's tokens, so the host's output work overlaps the GPU (engine/runner/async_decode.py)."""
    deterministic: bool = False
    """Batch-invariant forward (engine/runner/batch_invariant.py): a request's greedy and seeded
    outputs are bitwise the same alone and in any batch, at a cost in speed (no fast path)."""
    tensor_parallel_size: int = 1
    """GPUs one model is split across [1, 8] (engine/parallel): cuda:N.. of `device`, one worker
    process per rank after the first; on CPU the ranks are gloo processes. Must divide the
    model's attention heads, KV heads, MLP inner size and vocabulary."""
    grammar_compile_timeout_s: float = 10.0
    """Longest a structured-output grammar may compile; past it the compile's worker process is
    killed and its requests fail (engine/structured_outputs/compiler.py)."""
    grammar_compile_workers: int = 2
    """Worker processes compiling structured-output grammars [1, 64]."""
    max_queued_grammars: int = 16
    """Grammars that may wait for a compile worker; past it a request is refused with 503 and
    Retry-After [0, 4096]."""
    grammar_cache_bytes: int = 256 << 20
    """Memory the compiled-grammar cache may hold; also the largest one compiled grammar may take."""
    max_grammar_values: int = 1024
    """Most enum/const values (JSON schema) or choices one structured-output constraint may list,
    checked at the API (400 naming the field)."""
    max_grammar_bytes: int = 128 << 10
    """Largest structured-output constraint (JSON schema, regex, grammar or choices) in bytes,
    checked at the API (400 naming the field)."""

    def __post_init__(self) -> None:
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("load_format", self.load_format, LOAD_FORMATS)
        if not isinstance(self.device, str) or not (
            self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")
        ):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N; got {self.device!r}")
        check_range("seed", self.seed, 0)
        check_choice("block_size", self.block_size, BLOCK_SIZES)
        check_range("kv_cache_bytes", self.kv_cache_bytes, 0)
        check_range("gpu_memory_utilization", self.gpu_memory_utilization, 0.01, 1.0)
        check_range("max_model_len", self.max_model_len, 0)
        check_range("watermark", self.watermark, 0.0, 0.5)
        check_range("priority_aging_steps", self.priority_aging_steps, 1)
        check_range("best_effort_seat_share", self.best_effort_seat_share, 0.0, 1.0)
        if not isinstance(self.async_scheduling, bool):
            raise ValueError(f"async_scheduling must be true or false, got {self.async_scheduling!r}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching must be true or false, got {self.enable_prefix_caching!r}")
        check_range("tensor_parallel_size", self.tensor_parallel_size, 1, 8)
        if not isinstance(self.deterministic, bool):
            raise ValueError(f"deterministic must be true or false, got {self.deterministic!r}")
        if self.deterministic and self.tensor_parallel_size > 1:
            raise ValueError("deterministic needs tensor_parallel_size 1 (the all-reduce is not batch-invariant)")
        if self.load_format == "dummy" and self.tensor_parallel_size > 1:
            raise ValueError(
                "load_format=dummy needs tensor_parallel_size 1 (the ranks load their shards from the checkpoint)"
            )
        check_range("grammar_compile_timeout_s", self.grammar_compile_timeout_s, 0.001)
        check_range("grammar_compile_workers", self.grammar_compile_workers, 1, 64)
        check_range("max_queued_grammars", self.max_queued_grammars, 0, 4096)
        check_range("grammar_cache_bytes", self.grammar_cache_bytes, 1 << 20)
        check_range("max_grammar_values", self.max_grammar_values, 1)
        check_range("max_grammar_bytes", self.max_grammar_bytes, 1024)
        validate_changes(self.tunables())

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EngineConfig:
        return from_fields(cls, values, "EngineConfig field")

    def tunables(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in TUNABLE_BOUNDS}

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    def with_changes(self, changes: Mapping[str, Any]) -> EngineConfig:
        """This configuration with run-time changes (tunables only), validated as every
        configuration is, by `__post_init__`: a TunableError names the field at fault."""
        for name in changes:
            _check_tunable_name(name)
        try:
            return dataclasses.replace(self, **changes)
        except TunableError:
            raise
        except ValueError as exc:  # a rule across fields: name the first changed field it mentions
            raise TunableError(next((n for n in changes if n in str(exc)), next(iter(changes))), str(exc)) from None


class TunableError(ValueError):
    """A run-time change refused; `name` is the tunable it concerns."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


def validate_changes(changes: Mapping[str, Any]) -> None:
    """The one check of tunable values against TUNABLE_BOUNDS, in the order given: the first
    fault raises a TunableError naming it. A configuration runs it on itself; the admin API
    runs it before a change crosses to the engine core, whose channel cannot carry every
    value JSON can (an integer past 64 bits, a lone surrogate)."""
    for name, value in changes.items():
        validate_tunable(name, value)


def _check_tunable_name(name: str) -> None:
    if name not in TUNABLE_BOUNDS:
        raise TunableError(name, f"{name} is not a tunable parameter; tunables: {', '.join(TUNABLE_BOUNDS)}")


def validate_tunable(name: str, value: Any) -> None:
    _check_tunable_name(name)
    bounds = TUNABLE_BOUNDS[name]
    try:
        if isinstance(bounds[0], str):
            check_choice(name, value, bounds)
        else:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            check_range(name, value, bounds[0], bounds[1])
    except TunableError:
        raise
    except ValueError as exc:
        raise TunableError(name, str(exc)) from None
