"""Statistics that leave the engine's step loop as small dataclasses.

The engine fills `StepStats` once per step and keeps cumulative `EngineCounters`;
metric loggers (the server's Prometheus logger, the benchmark) consume them. No
metric library is touched inside the step.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model.model_config import ModelConfig


@dataclass(slots=True)
class FinishedRequestStats:
    finish_reason: str
    num_prompt_tokens: int
    num_generation_tokens: int
    e2e_latency: float
    queue_time: float
    prefill_time: float
    decode_time: float
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    request_id: str = ""  # the API joins it to the request's SLO class and predicted TTFT


@dataclass(slots=True)
class StepStats:
    batch_size: int
    num_batched_tokens: int
    timestamp: float = field(default_factory=time.time)  # when the step was planned
    duration: float = 0.0  # the rest is filled in when the step's outputs are processed
    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    kv_tokens_read: int = 0  # context tokens the step's attention reads (decode bytes accounting)
    time_to_first_tokens: list[float] = field(default_factory=list)
    first_token_request_ids: list[str] = field(default_factory=list)  # admission: no longer waiting for prefill
    inter_token_latencies: list[float] = field(default_factory=list)
    finished: list[FinishedRequestStats] = field(default_factory=list)


@dataclass(slots=True)
class EngineCounters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    swap_in_faults: int = 0
    recompute_faults: int = 0
    swap_in_bytes: int = 0
    swap_out_bytes: int = 0
    swap_seconds: float = 0.0  # wall time of the swap copies, which the step waits for
    prefix_queries: int = 0
    prefix_hits: int = 0
    requests_finished: Counter = field(default_factory=Counter)  # finish_reason -> count
    fastpath_failures: Counter = field(default_factory=Counter)  # reason -> count
    fastpath_launch_errors: Counter = field(default_factory=Counter)  # exception type -> steps it sent portable
    quantized_blocks: Counter = field(default_factory=Counter)  # cold dtype -> blocks quantized
    quantize_seconds: float = 0.0
    decode_steps_launched_ahead: int = 0  # async scheduling: launched before the previous step's tokens were read
    # Pure decode steps: their wall time, and the bytes they must read (every weight once,
    # each sequence's KV context at full precision): bytes over seconds is the decode
    # memory bandwidth the engine achieves, the numerator of its MBU.
    decode_seconds: float = 0.0
    decode_bytes_read: int = 0
    cuda_graphs_captured: int = 0  # decode graphs on the fast path: read when a snapshot is taken, not counted


def kv_tokens_read(batch) -> int:
    """Context tokens a step's attention reads: each scheduled sequence's, through its new tokens."""
    return sum(item.seq.num_computed_tokens + item.num_tokens for item in batch)


def decode_weight_bytes(cfg: ModelConfig, dtype_bytes: int) -> int:
    """Bytes of weights a decode step reads: every projection, the LM head and the norms;
    the embedding table only a row per token (negligible), unless tied to the LM head."""
    attn = cfg.hidden_size * cfg.head_dim * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
    mlp = 3 * cfg.hidden_size * cfg.intermediate_size
    norms = (2 * cfg.num_hidden_layers + 1) * cfg.hidden_size
    return (cfg.num_hidden_layers * (attn + mlp) + cfg.vocab_size * cfg.hidden_size + norms) * dtype_bytes


@dataclass(slots=True, frozen=True)
class KVSnapshot:
    num_blocks: int
    num_used: int
    num_free: int
    num_cached: int
    fragmentation_ratio: float
    num_host_blocks: int
    num_host_free: int
    blocks_by_dtype: dict = field(default_factory=dict)  # live blocks: hot, int8, int4
    bytes_saved: int = 0  # KV bytes the live cold blocks save against full precision

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks if self.num_blocks else 0.0
