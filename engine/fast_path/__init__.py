"""The GPU fast path: Triton paged decode attention, fused small ops, CUDA graphs for
decode steps, greedy sampling on the device.

Imports cleanly without CUDA or Triton; `attach_fast_path` then leaves the runner on
the portable path and returns the reason.
"""
from __future__ import annotations

import logging

from .availability import has_triton, unavailable_reason
from .cuda_graphs import GRAPH_LADDER, graph_batch_size, is_pure_decode
from .gpu_sampling import greedy_on_device

log = logging.getLogger(__name__)

__all__ = ["attach_fast_path", "has_triton", "unavailable_reason", "GRAPH_LADDER", "graph_batch_size",
           "is_pure_decode", "greedy_on_device"]


def hot_kv_layers(runner) -> list[tuple]:
    """Per layer (k_cache, v_cache) views of the hot KV blocks, from either runner layout."""
    layers = getattr(runner, "kv_layers", None) or runner.kv_cache.layers
    return [(kv[0], kv[1]) for kv in layers]


def attach_fast_path(runner, max_model_len: int, use_graphs: bool = True) -> str | None:
    """Give `runner` the Triton attention and the decode graphs when this device can run
    them. Returns None when attached, else why not (the runner keeps the portable path).
    Decode batches with quantized (cold) KV blocks run eagerly through the cold-aware
    Triton kernel (no graphs); prefill over cold blocks takes the portable path."""
    reason = unavailable_reason(runner.device, runner.kv_cache.dtype)
    if reason is not None:
        log.info("fast path unavailable: %s; using the portable path", reason)
        return reason
    from .cuda_graphs import DecodeGraphs
    from .fast_decoder import FastDecoder
    from .triton_attention import triton_paged_attention

    runner.fast_attention = triton_paged_attention
    decoder = FastDecoder(runner.model, hot_kv_layers(runner))
    runner.fast_decode = DecodeGraphs(decoder, runner.block_size, max_model_len, runner.device,
                                      num_hot_blocks=runner.kv_cache.num_blocks, use_graphs=use_graphs)
    log.info("fast path attached: Triton paged attention, fused ops, CUDA graphs %s",
             "on" if use_graphs else "off")
    return None
