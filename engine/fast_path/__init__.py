"""The GPU fast path: Triton paged decode attention, fused small ops, CUDA graphs for
decode steps, greedy sampling on the device.

Imports cleanly without CUDA or Triton; `attach_fast_path` then leaves the runner on
the portable path and returns the reason.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..model.attention import paged_attention
from .availability import has_triton, unavailable_reason
from .cuda_graphs import GRAPH_LADDER, DecodeGraphs, graph_batch_size, is_pure_decode
from .warmup import warm_prefill_kernels

if TYPE_CHECKING:
    from ..runner.model_runner import ModelRunner

log = logging.getLogger(__name__)

__all__ = [
    "attach_fast_path",
    "has_triton",
    "unavailable_reason",
    "GRAPH_LADDER",
    "graph_batch_size",
    "is_pure_decode",
]


def hot_kv_layers(runner: ModelRunner) -> list[tuple]:
    """Per layer (k_cache, v_cache) views of the hot KV blocks."""
    return [(kv[0], kv[1]) for kv in runner.kv_layers]


def attach_fast_path(
    runner: ModelRunner,
    max_model_len: int,
    use_graphs: bool = True,
    capture: bool = True,
    max_step_tokens: int = 0,
) -> str | None:
    """Give `runner` the Triton attention and the decode graphs when this device can run
    them, capturing every graph now (`capture`: compile and capture at start, not in the
    middle of serving; `max_step_tokens`: warm the prefill path with one step that
    large, warmup.py). Returns None when attached, else why not (the runner keeps the
    portable path). Decode batches with cold blocks leading each table replay graphs of
    their own; other cold layouts run eagerly through the general cold kernel; prefill
    over cold blocks runs the grouped SDPA path over dequantized gathers."""
    reason = unavailable_reason(runner.device, runner.kv_cache.dtype)
    if reason is not None:
        log.info("fast path unavailable: %s; using the portable path", reason)
        return reason
    # imported here: these modules define Triton kernels, and this package imports without Triton
    from .attention import triton_paged_attention
    from .fast_decoder import FastDecoder

    runner.fast_attention = triton_paged_attention
    decoder = FastDecoder(runner.model, runner.kv_layers)
    runner.fast_decode = DecodeGraphs(
        decoder, runner.block_size, max_model_len, runner.device, pages=runner.pages, use_graphs=use_graphs
    )
    if use_graphs and capture:
        start = time.perf_counter()
        try:
            runner.fast_decode.capture_all()
        except Exception as exc:  # a kernel that does not compile or capture here: stay portable
            runner.fast_attention, runner.fast_decode = paged_attention, None
            log.error("fast path unavailable: graph capture failed (%s: %s)", type(exc).__name__, exc)
            return f"graph capture failed: {type(exc).__name__}: {exc}"
        graphs = runner.fast_decode
        log.info(
            "captured %d decode graphs and %d chunk graphs in %.1f s",
            len(graphs.graphs),
            len(graphs.chunk_graphs),
            time.perf_counter() - start,
        )
        start = time.perf_counter()
        try:
            warm_prefill_kernels(
                decoder, triton_paged_attention, runner.block_size, runner.device, max_step_tokens, max_model_len
            )
        except Exception as exc:  # the first real prefill compiles them then (or falls back on its own)
            log.warning("prefill kernel warm-up failed (%s: %s)", type(exc).__name__, exc)
        log.info("compiled the prefill path's kernels in %.1f s", time.perf_counter() - start)
    log.info("fast path attached: Triton paged attention, fused ops, CUDA graphs %s", "on" if use_graphs else "off")
    return None
