"""CUDA graphs for deterministic mode's decode steps (engine/runner/batch_invariant.py).

Run eagerly, a batch-invariant decode step is about a thousand launches of small
kernels and torch ops a token, and the host, not the GPU, sets its pace. Captured once
per batch size of a ladder and replayed, it costs the GPU time of those launches only.

Replaying keeps the mode's promise because every step of the batch-invariant forward
computes each row from that row alone, with a launch that does not depend on the number
of rows (fixed-tiling products, norms in fixed tiles, one decode-kernel row per token
with a fixed split count). So a row computed in a graph of 8 rows is bitwise the row
computed eagerly in a batch of 3, or alone.

Padding rows need one more thing: their K/V write must not disturb any sequence, and
the portable K/V write (index assignment) has no slot that means "skip" (a negative
slot would wrap around to the arena's end). Padding rows are therefore copies of row
0: same token, position, slot, context and block table. Each computes exactly row 0's
values and writes row 0's K/V slot with the same bytes, so the slot holds what row 0
alone would have left there, whichever write lands last.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from ..fast_path.availability import unavailable_reason
from ..fast_path.cuda_graphs import (
    GRAPH_LADDER,
    DecodeInputs,
    capture_graph,
    graph_batch_size,
    is_pure_decode,
    pinned_rows,
)
from ..model.attention import AttentionMetadata, paged_attention
from ..scheduling.scheduler import ScheduledSeq

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

    from ..model.model import LlamaModel
    from .model_runner import ModelRunner

log = logging.getLogger(__name__)

TABLE_ALIGN = 16
"""Block-table width multiple, as ModelRunner.prepare pads its tables: the decode kernel
then sees the same argument alignment in a replay as in an eager step."""


def copies_of_first_row(rows: DecodeInputs, size: int) -> DecodeInputs:
    """`rows` padded to `size` with copies of its first row (see the module docstring)."""
    pad = size - len(rows.input_ids)
    if pad < 0:
        raise ValueError(f"{len(rows.input_ids)} rows do not fit a graph of {size}")
    if not rows.input_ids:
        raise ValueError("no row to copy: a step has at least one")
    return DecodeInputs(
        rows.input_ids + rows.input_ids[:1] * pad,
        rows.positions + rows.positions[:1] * pad,
        rows.slots + rows.slots[:1] * pad,
        rows.context_lens + rows.context_lens[:1] * pad,
        rows.block_tables + rows.block_tables[:1] * pad,
    )


class InvariantDecodeGraphs:
    """Decode steps of a batch-invariant model (make_batch_invariant) on CUDA graphs of
    the ladder's sizes; `use_graphs=False` runs the same padded steps eagerly (tests,
    and devices without graphs). `kv_layers` returns the runner's current per-layer
    (k, v, cold) views."""

    def __init__(
        self,
        model: LlamaModel,
        kv_layers,
        block_size: int,
        max_model_len: int,
        num_pages: int,
        device: torch.device,
        ladder: tuple[int, ...] = GRAPH_LADDER,
        use_graphs: bool = True,
    ):
        if not ladder or min(ladder) < 1:
            raise ValueError(f"ladder must hold positive batch sizes, got {ladder}")
        if model.config.sliding_window is not None:
            raise ValueError("a sliding window attends token by token on the host: not capturable")
        self.model = model
        self.kv_layers = kv_layers
        self.block_size = block_size
        self.ladder = tuple(sorted(ladder))
        self.max_batch = self.ladder[-1]
        blocks = -(-max_model_len // block_size)
        self.max_blocks = -(-blocks // TABLE_ALIGN) * TABLE_ALIGN
        self.num_pages = num_pages  # block ids at or past it are cold pages: those steps run eagerly
        self.device = device
        self.use_graphs = use_graphs
        n = self.max_batch
        # Static inputs, as in the eager step: int64 ids, positions, slots and context
        # lengths (one [4, n] tensor, one copy in), int32 block tables.
        self.header = torch.zeros(4, n, dtype=torch.long, device=device)
        self.input_ids, self.positions, self.slots, self.context_lens = self.header.unbind(0)
        self.block_tables = torch.zeros(n, self.max_blocks, dtype=torch.int32, device=device)
        pin = device.type == "cuda"
        self._header_host = torch.zeros(4, n, dtype=torch.long, pin_memory=pin)
        self._tables_host = torch.zeros(n * self.max_blocks, dtype=torch.int32, pin_memory=pin)  # pinned_rows
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool: _POOL_HANDLE | None = None
        self.num_replays = 0
        self.num_eager = 0

    def can_run(self, batch: list[ScheduledSeq]) -> bool:
        """A pure-decode batch that fits, every block of it hot."""
        return (
            is_pure_decode(batch)
            and len(batch) <= self.max_batch
            and all(
                len(item.seq.block_table) <= self.max_blocks and max(item.seq.block_table) < self.num_pages
                for item in batch
            )
        )

    def execute(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        """Logits [len(batch), vocab] float32 of a batch `can_run` accepts (graph memory:
        use them before the next step of the same size)."""
        rows = DecodeInputs.from_batch(batch, self.block_size)
        size = graph_batch_size(len(batch), self.ladder)
        assert size is not None  # can_run: no more rows than the ladder's top
        self._load(copies_of_first_row(rows, size))
        if not self.use_graphs:
            self.num_eager += 1
            return self._run(size)[: len(batch)]
        if size not in self.graphs:
            self._capture(size)
        graph, logits = self.graphs[size]
        graph.replay()
        self.num_replays += 1
        return logits[: len(batch)]

    def capture_all(self) -> None:
        """Capture every size now, largest first (the smaller ones reuse its memory), on
        one row at position 0 of block 0 copied to the size: call it before any sequence
        holds a block (the warm-up runs write that slot)."""
        if not self.use_graphs:
            return
        start = DecodeInputs([0], [0], [0], [1], [[0]])
        for size in reversed(self.ladder):
            if size not in self.graphs:
                self._load(copies_of_first_row(start, size))
                self._capture(size)

    def _load(self, rows: DecodeInputs) -> None:
        n = len(rows.input_ids)
        self._header_host[:, :n] = torch.tensor(
            [rows.input_ids, rows.positions, rows.slots, rows.context_lens], dtype=torch.long
        )
        width = max(len(t) for t in rows.block_tables)
        tables = pinned_rows(self._tables_host, n, width)
        tables.zero_()
        for i, table in enumerate(rows.block_tables):
            tables[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
        # Synchronous: the host buffers are reused by the next step, and a decode step of
        # this mode waits for its logits anyway.
        self.header.copy_(self._header_host)
        self.block_tables[:n, :width].copy_(tables)

    def _run(self, size: int) -> torch.Tensor:
        meta = AttentionMetadata(
            query_start=list(range(size)),
            query_lens=[1] * size,
            context_lens=self.context_lens[:size],
            block_tables=self.block_tables[:size],
            slot_mapping=self.slots[:size],
            positions=self.positions[:size],
            max_query_len=1,
            max_context_len=self.max_blocks * self.block_size,
        )
        hidden = self.model(self.input_ids[:size], meta, self.kv_layers(), paged_attention)
        return self.model.compute_logits(hidden)

    def _capture(self, size: int) -> None:
        graph, logits = capture_graph(lambda: self._run(size), self.device, self._pool)
        self._pool = graph.pool()
        self.graphs[size] = (graph, logits)


def attach_invariant_decode(runner: ModelRunner, max_model_len: int) -> str:
    """Give a deterministic-mode runner its decode graphs where the device runs them
    (capturing every size now); returns what the runner runs, for the engine's
    `fast_path_unavailable` (the fused fast path never runs in this mode)."""
    reason = unavailable_reason(runner.device, runner.kv_cache.dtype)
    if reason is not None:
        return "deterministic mode: the batch-invariant portable steps"
    steps = "deterministic mode: the batch-invariant fused steps"
    if runner.model.config.sliding_window is not None:
        return steps
    graphs = InvariantDecodeGraphs(
        runner.model,
        lambda: runner.kv_layers,
        runner.block_size,
        max_model_len,
        runner.kv_cache.num_blocks,
        runner.device,
    )
    start = time.perf_counter()
    try:
        graphs.capture_all()
    except Exception as exc:  # decode then runs eagerly, as it does without graphs
        log.error("deterministic decode graphs: capture failed (%s: %s)", type(exc).__name__, exc)
        return steps
    runner.invariant_decode = graphs
    log.info("captured %d deterministic decode graphs in %.1f s", len(graphs.graphs), time.perf_counter() - start)
    return steps + ", decode steps in CUDA graphs"
