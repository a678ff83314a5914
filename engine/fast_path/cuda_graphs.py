"""CUDA graphs for decode steps: one graph per batch size of a ladder, replayed with
the batch padded up to the next size.

Static input buffers hold the largest batch; a graph of size n reads their first n
rows. Padded rows carry slot -1 (their K/V write is skipped) and context length 0
(their attention is empty and returns zeros), so they touch no real sequence's KV.
Graphs are captured per (size, cold kind): batches whose sequences have quantized
blocks get graphs whose attention reads each table as a run of cold blocks followed
by hot ones (cold_layout.py); other cold layouts run eagerly. The engine captures
every size at start (`capture_all()`, largest first, so the smaller ones reuse the
shared memory pool); a size or kind first needed later is captured then.
Nothing in a replay reads back to the host: the only synchronisation of a decode
step is the caller's read of the sampled tokens. Each graph ends with the greedy
tokens and the finiteness flag of its logits (greedy_head.py), so a greedy step
needs no kernel outside its graph.

Short prefill chunks run on the same graphs: a chunk of n tokens becomes n rows, row i
computing position start + i over the sequence's own block table with context
start + i + 1. Every row's K/V is written before any row attends, and each row sees
exactly the keys up to itself, so the rows together are the chunk's causal attention;
only the chunk's last row samples. The typical case is a prompt whose long prefix is
cached: its new tokens cost one graph replay (about one decode step of as many rows)
instead of an eager forward of a thousand launches. A step of chunks only (no decode
rows) lays each chunk out in packs of `rows_per_pack` rows that read their K/V once
(attention/chunk_rows.py), on graphs of their own (`chunk_graphs`, hot blocks only),
for up to `max_expanded_rows` rows; from LARGE_PACK_MIN_ROWS rows on, in larger packs
(`large_rows_per_pack`) when those fit the same graph. Where every row reads its whole
context alone (chunks beside decode rows, cold blocks, no packs), a step stays at most
`max_unpacked_rows` rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch

from ..kv.block_manager import token_slots
from ..kv.block_pool import PageAllocator
from ..memory.device_index import device_index
from ..scheduling.scheduler import ScheduledSeq
from .cold_layout import cold_prefix_layout

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE  # torch's own name for a graph memory pool's handle

    from .fast_decoder import FastDecoder

T = TypeVar("T")
GRAPH_LADDER = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PAD_SLOT = -1
MAX_EXPANDED_ROWS = 256
"""Rows a step of prefill chunks alone may take on the graphs, in packs (module docstring).
On the H200, 2,048 cached + 128 / 256 new tokens: 7.9 / 13.9 ms to the first token as
graph rows, 21.9 / 22.4 ms through the eager forward (bench/gpu_decode.py, warm_by_new_tokens)."""
MAX_UNPACKED_ROWS = 64
"""Rows a step may take on the graphs when each row reads its context alone."""
LARGE_PACK_MIN_ROWS = 64
"""Rows (in small packs) from which a step of chunks takes the large packs
(attention/chunk_rows.py, LARGE_PACK_QUERIES)."""


def graph_batch_size(num_seqs: int, ladder: tuple[int, ...] = GRAPH_LADDER) -> int | None:
    """The smallest ladder size holding `num_seqs` rows; None when none does (run eagerly)."""
    if num_seqs < 1:
        raise ValueError(f"num_seqs must be at least 1, got {num_seqs}")
    return next((size for size in sorted(ladder) if size >= num_seqs), None)


def rows_in_packs(batch: list[ScheduledSeq], rows_per_pack: int) -> int:
    """Rows of a step with each item's tokens in whole packs (padding included)."""
    return sum(-(-item.num_tokens // rows_per_pack) * rows_per_pack for item in batch)


def is_pure_decode(batch: list[ScheduledSeq]) -> bool:
    """Every sequence computes exactly its one newest token (and so samples)."""
    return bool(batch) and all(item.num_tokens == 1 and item.completes for item in batch)


@dataclass(slots=True)
class DecodeInputs:
    """Host-side rows of one graph step (built once, copied to the static buffers)."""

    input_ids: list[int]
    positions: list[int]
    slots: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]
    # Rows whose logits the step samples from, in batch order; None: every row (decode).
    sample_rows: list[int] | None = None

    @classmethod
    def from_batch(cls, batch: list[ScheduledSeq], block_size: int) -> DecodeInputs:
        ids, pos, slots, ctx, tables = [], [], [], [], []
        for item in batch:
            seq = item.seq
            p = seq.num_computed_tokens
            ids.append((seq.output_token_ids or seq.prompt_token_ids)[-1])  # p is the newest token
            pos.append(p)
            slots.append(seq.block_table[p // block_size] * block_size + p % block_size)
            ctx.append(p + 1)
            tables.append(seq.block_table)
        return cls(ids, pos, slots, ctx, tables)

    @classmethod
    def expanded(cls, batch: list[ScheduledSeq], block_size: int, rows_per_pack: int = 1) -> DecodeInputs:
        """One row per token the batch computes (prefill chunks and decode tokens alike);
        with rows_per_pack > 1 each item's rows start a pack (padding rows between)."""
        rows = cls([], [], [], [], [], sample_rows=[])
        assert rows.sample_rows is not None
        for item in batch:
            rows.pad_to_multiple(rows_per_pack)
            seq, start, n = item.seq, item.seq.num_computed_tokens, item.num_tokens
            rows.input_ids.extend(seq.tokens(start, start + n))
            rows.positions.extend(range(start, start + n))
            rows.slots.extend(token_slots(seq.block_table, block_size, start, start + n))
            rows.context_lens.extend(range(start + 1, start + n + 1))
            rows.block_tables.extend([seq.block_table] * n)
            if item.completes:
                rows.sample_rows.append(len(rows.input_ids) - 1)
        return rows

    def pad_to_multiple(self, multiple: int) -> None:
        for _ in range(-len(self.input_ids) % multiple):
            self.input_ids.append(0)
            self.positions.append(0)
            self.slots.append(PAD_SLOT)
            self.context_lens.append(0)
            self.block_tables.append([])

    def padded(self, size: int) -> DecodeInputs:
        pad = size - len(self.input_ids)
        if pad < 0:
            raise ValueError(f"{len(self.input_ids)} rows do not fit a graph of {size}")
        return DecodeInputs(
            self.input_ids + [0] * pad,
            self.positions + [0] * pad,
            self.slots + [PAD_SLOT] * pad,
            self.context_lens + [0] * pad,
            self.block_tables + [[]] * pad,
            self.sample_rows,
        )


def pinned_rows(flat: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """A contiguous [rows, width] view of a flat (pinned) host buffer: the source of a
    table's copy to the device. A [rows, width] slice of a wider host tensor is not
    contiguous, and torch copies such a source through a pageable temporary: a copy the
    driver makes synchronous (it waits for the stream's earlier work, a step in flight
    included) instead of an asynchronous one from pinned memory."""
    if rows * width > flat.numel():
        raise ValueError(f"{rows} x {width} entries do not fit a host buffer of {flat.numel()}")
    return flat[: rows * width].view(rows, width)


def capture_graph(
    step: Callable[[], T], device: torch.device, pool: _POOL_HANDLE | None
) -> tuple[torch.cuda.CUDAGraph, T]:
    """A CUDA graph of `step` and its outputs (graph memory, in `pool` when given). Two
    warm-up runs first, on a side stream, compile the kernels outside the capture; they
    compute the step the replay will (same inputs, same K/V slots), so they are harmless."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = step()
    return graph, outputs


class DecodeGraphs:
    def __init__(
        self,
        decoder: FastDecoder,
        block_size: int,
        max_model_len: int,
        device: torch.device,
        pages: PageAllocator | None = None,
        ladder: tuple[int, ...] = GRAPH_LADDER,
        use_graphs: bool = True,
        max_expanded_rows: int = MAX_EXPANDED_ROWS,
        max_unpacked_rows: int = MAX_UNPACKED_ROWS,
    ):
        if not ladder or min(ladder) < 1:
            raise ValueError(f"ladder must hold positive batch sizes, got {ladder}")
        self.decoder = decoder
        self.block_size = block_size
        self.ladder = tuple(sorted(ladder))
        self.max_batch = self.ladder[-1]
        self.max_blocks = -(-max_model_len // block_size)
        self.max_model_len = max_model_len
        self.pages = pages  # locates cold blocks (kind, page, slot); None when every block is hot
        self.device = device
        self.use_graphs = use_graphs
        if max_expanded_rows < 0 or max_unpacked_rows < 0:
            raise ValueError(
                f"max_expanded_rows and max_unpacked_rows must be at least 0, got {max_expanded_rows} "
                f"and {max_unpacked_rows}"
            )
        self.max_expanded_rows = min(max_expanded_rows, self.max_batch)  # 0: decode steps only
        self.max_unpacked_rows = max_unpacked_rows
        # Rows of a chunk's pack (1: no packing); a stand-in decoder in tests may not say.
        self.rows_per_pack = getattr(decoder, "chunk_rows_per_pack", lambda: 1)()
        self.large_rows_per_pack = getattr(decoder, "chunk_large_rows_per_pack", lambda: self.rows_per_pack)()
        n = self.max_batch
        # Static inputs: rows of one [5, n] tensor (ids, positions, slots, context lengths,
        # leading cold blocks) and the block tables (pages) and slots within pages, each
        # filled by one copy from a pinned host twin.
        self.header = torch.zeros(5, n, dtype=torch.long, device=device)
        self.input_ids, self.positions, self.slots, self.context_lens, self.cold_blocks = self.header.unbind(0)
        self.slots.fill_(PAD_SLOT)
        self.block_tables = torch.zeros(n, self.max_blocks, dtype=torch.int32, device=device)
        self.block_slots = torch.zeros(n, self.max_blocks, dtype=torch.int32, device=device)
        pin = device.type == "cuda"
        # Two sets of host twins, alternating: with a step in flight (async scheduling)
        # the next step's rows are written while the previous copies may be pending.
        # The tables' twins are flat: a step's [rows, width] is a contiguous view of the
        # first rows * width entries (pinned_rows).
        self._host_sets = [
            (
                torch.zeros(5, n, dtype=torch.long, pin_memory=pin),
                torch.zeros(n * self.max_blocks, dtype=torch.int32, pin_memory=pin),
                torch.zeros(n * self.max_blocks, dtype=torch.int32, pin_memory=pin),
            )
            for _ in range(2)
        ]
        self._host_turn = 0
        # (batch size, cold kind code) -> (graph, its logits, its packed greedy tokens and
        # flag); kind 0: no cold block in the batch
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        # (size, rows per pack) -> the same, for steps of chunks in packs (hot blocks)
        self.chunk_graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self._greedy: torch.Tensor | None = None  # the last step's packed greedy answer
        self._pool: _POOL_HANDLE | None = None  # the graphs' shared memory pool, once one is captured
        self.num_replays = 0
        self.num_eager = 0
        self.num_expanded = 0  # steps with prefill chunks run as rows
        self.num_packed = 0  # of those, steps of chunks in packs
        self.num_large_packed = 0  # of those, in the large packs

    def can_run(self, batch: list[ScheduledSeq]) -> bool:
        """A pure-decode batch that fits, or a step with prefill chunks small enough to run
        as rows (none of whose requests scores its prompt: those need every row's logits)."""
        if not self.fits(batch):
            return False
        return is_pure_decode(batch) or self.can_expand(batch)

    def can_expand(self, batch: list[ScheduledSeq]) -> bool:
        limit = self.max_expanded_rows if self.pack_for(batch) > 1 else self.unpacked_limit()
        return 0 < self.expanded_rows(batch) <= limit and all(item.seq.params.prompt_logprobs is None for item in batch)

    def unpacked_limit(self) -> int:
        """Rows a step may take when each row reads its context alone (no packs)."""
        return min(self.max_unpacked_rows, self.max_expanded_rows)

    def pack_for(self, batch: list[ScheduledSeq]) -> int:
        """Rows per pack for an expanded step: 1 unless it is chunks only; then the large
        packs from LARGE_PACK_MIN_ROWS rows on, where they fit the same graph size."""
        small, large = self.rows_per_pack, self.large_rows_per_pack
        if small == 1 or not all(item.num_tokens > 1 for item in batch):
            return 1
        rows = rows_in_packs(batch, small)
        if large > small and rows >= LARGE_PACK_MIN_ROWS:
            size = graph_batch_size(rows, self.ladder)
            if size is not None and graph_batch_size(rows_in_packs(batch, large), self.ladder) == size:
                return large
        return small

    def expanded_rows(self, batch: list[ScheduledSeq]) -> int:
        """Rows the step takes expanded, padding between packs included."""
        return rows_in_packs(batch, self.pack_for(batch))

    def fits(self, batch: list[ScheduledSeq]) -> bool:
        return len(batch) <= self.max_batch and all(len(item.seq.block_table) <= self.max_blocks for item in batch)

    def num_splits(self, size: int, rows_per_pack: int = 1) -> int:
        """Splits of a graph of `size` rows: for the decode kernel's rows, or with packs of
        `rows_per_pack` rows (a chunk graph) for the chunk-row kernel's packs."""
        from .attention import choose_num_splits, chunk_num_splits  # Triton kernels: loaded on first use

        if rows_per_pack > 1:
            return chunk_num_splits(size // rows_per_pack, self.decoder.num_kv_heads, self.max_model_len)
        return choose_num_splits(size, self.decoder.num_kv_heads, self.max_model_len)

    def execute(self, batch: list[ScheduledSeq], fed_ids: torch.Tensor | None = None) -> torch.Tensor | None:
        """Logits [len(batch), vocab] float32 for a pure-decode batch; None when its cold
        blocks are not laid out as leading runs of one kind (the caller runs it eagerly).
        `fed_ids` ([len(batch)], on the device): the rows' input tokens when the host has
        not seen them yet (the previous step's tokens, async scheduling); each row then
        computes position `num_computed_tokens` of its sequence. A batch with prefill
        chunks (can_expand) runs as one row per token; the logits are then those of its
        completing items' last rows (decode rows included), in batch order."""
        # Fed rows are decode rows whose input token the host has not appended yet, so
        # they do not look like they complete their sequences: never expand them.
        pack = 1
        if fed_ids is not None or is_pure_decode(batch):
            rows = DecodeInputs.from_batch(batch, self.block_size)
        else:
            pack = self.pack_for(batch)
            rows = DecodeInputs.expanded(batch, self.block_size, pack)
        size = graph_batch_size(len(rows.input_ids), self.ladder)
        assert size is not None  # callers check can_run or fits: no more rows than the ladder's top
        kind = self._load(rows.padded(size))
        if kind and pack > 1:  # cold blocks: packs read hot blocks only
            if rows_in_packs(batch, 1) > self.unpacked_limit():
                return None
            # Reload through the same host set: a step in flight may still read the other
            # one, and this step's first copies are overwritten by the second, in stream order.
            self._host_turn ^= 1
            pack, rows = 1, DecodeInputs.expanded(batch, self.block_size)
            size = graph_batch_size(len(rows.input_ids), self.ladder)
            assert size is not None
            kind = self._load(rows.padded(size))
        if kind is None:
            return None
        if fed_ids is not None:
            self.input_ids[: len(batch)].copy_(fed_ids)
        self.num_packed += pack > 1
        self.num_large_packed += pack > self.rows_per_pack
        if not self.use_graphs:
            self.num_eager += 1
            logits, greedy = self._run(size, kind, pack)
        else:
            if pack > 1:
                if (size, pack) not in self.chunk_graphs:
                    self._capture(size, kind, pack)
                graph, logits, greedy = self.chunk_graphs[size, pack]
            else:
                if (size, kind) not in self.graphs:
                    self._capture(size, kind)
                graph, logits, greedy = self.graphs[size, kind]
            graph.replay()
            self.num_replays += 1
        count = len(rows.input_ids)
        if rows.sample_rows is None:
            self._greedy = greedy
            return logits[:count]
        self.num_expanded += 1
        picked = device_index(rows.sample_rows, self.device)
        # [flag, tokens of the sampling rows]: the same packing as a decode step's
        self._greedy = torch.cat([greedy[:1], greedy[1:].index_select(0, picked)])
        return logits.index_select(0, picked)

    def greedy(self, num_rows: int) -> torch.Tensor:
        """The last executed step's [1 + num_rows] int64 on the device: 1 when its live
        rows' logits are all finite (else 0), then each row's argmax (greedy_head.py).
        Graph memory: read it (or copy it) before the next step of the same size."""
        if self._greedy is None or num_rows + 1 > self._greedy.numel():
            raise RuntimeError(f"no executed step with {num_rows} rows to read greedy tokens from")
        return self._greedy[: num_rows + 1]

    def capture_all(self) -> None:
        """Capture every ladder size now (largest first) on padding-only inputs, for
        batches without cold blocks and for each cold kind the KV cache holds."""
        if not self.use_graphs:
            return
        for kind in (0, *self.decoder.cold_kinds()):
            for size in reversed(self.ladder):
                if (size, kind) not in self.graphs:
                    self._load(DecodeInputs([], [], [], [], []).padded(size))
                    self._capture(size, kind)
        if self.rows_per_pack > 1:
            # The pack each size mostly runs with (pack_for). A step of LARGE_PACK_MIN_ROWS
            # rows or more whose large packs would need a bigger graph keeps the small
            # packs; that graph is captured when a step first needs it.
            for size in reversed(self.ladder):
                pack = self.large_rows_per_pack if size >= LARGE_PACK_MIN_ROWS else self.rows_per_pack
                if pack <= size <= self.max_expanded_rows and (size, pack) not in self.chunk_graphs:
                    self._load(DecodeInputs([], [], [], [], []).padded(size))
                    self._capture(size, 0, pack)

    def _load(self, rows: DecodeInputs) -> int | None:
        """Copy the rows into the static buffers (copies from pinned memory) and return
        the batch's cold kind code (0: none), or None for a layout the graphs do not
        take. The host buffers alternate between two sets: safe because the step two
        loads back (at most two are in flight) has been read."""
        header_host, tables_host, slots_host = self._host_sets[self._host_turn]
        self._host_turn ^= 1
        n = len(rows.input_ids)
        width = max(1, max(len(t) for t in rows.block_tables))
        table = np.zeros((n, width), dtype=np.int64)
        as_array: dict[int, np.ndarray] = {}  # a chunk's rows share its table: convert it once
        for i, t in enumerate(rows.block_tables):
            arr = as_array.get(id(t))
            if arr is None:
                arr = as_array[id(t)] = np.asarray(t, dtype=np.int64)
            table[i, : len(arr)] = arr
        cold_blocks, kind = np.zeros(n, dtype=np.int64), 0
        if self.pages is not None and (table >= self.pages.num_pages).any():
            kinds, page_ids, slot_ids = self.pages.locate_table(table)
            layout = cold_prefix_layout(kinds)
            if layout is None or layout[1] not in self.decoder.cold_kinds():
                return None
            cold_blocks, kind = layout
            table = page_ids
            slots_rows = pinned_rows(slots_host, n, width)
            slots_rows.copy_(torch.from_numpy(slot_ids.astype(np.int32)))
            self.block_slots[:n, :width].copy_(slots_rows, non_blocking=True)
        header_host[:4, :n] = torch.tensor(
            [rows.input_ids, rows.positions, rows.slots, rows.context_lens], dtype=torch.long
        )
        header_host[4, :n] = torch.from_numpy(cold_blocks.astype(np.int64))
        tables_rows = pinned_rows(tables_host, n, width)
        tables_rows.copy_(torch.from_numpy(table.astype(np.int32)))
        # The whole header (5 x max rows, a few KiB): a column slice is non-contiguous, and
        # torch copies it through a pageable temporary and a copy kernel (a profile of the
        # batch-1 engine showed one pageable copy and one such kernel per step).
        # Columns past n are stale but unread: the graph of this size reads the first n.
        self.header.copy_(header_host, non_blocking=True)
        self.block_tables[:n, :width].copy_(tables_rows, non_blocking=True)
        return kind

    def _run(self, size: int, kind: int = 0, rows_per_pack: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the static inputs' first `size` rows and their packed greedy answer."""
        # Kernel modules load on first use: importing this module (the engine does) must not
        # define kernels before a test has chosen Triton's interpreter.
        from .greedy_head import greedy_with_flag

        logits = self.decoder.forward(
            self.input_ids[:size],
            self.positions[:size],
            self.slots[:size],
            self.block_tables[:size],
            self.context_lens[:size],
            self.num_splits(size, rows_per_pack),
            cold_kind=kind,
            block_slots=self.block_slots[:size],
            cold_blocks=self.cold_blocks[:size],
            rows_per_pack=rows_per_pack,
        )
        return logits, greedy_with_flag(logits, live=self.context_lens[:size])

    def _capture(self, size: int, kind: int = 0, rows_per_pack: int = 1) -> None:
        graph, (logits, greedy) = capture_graph(lambda: self._run(size, kind, rows_per_pack), self.device, self._pool)
        self._pool = graph.pool()
        if rows_per_pack > 1:
            self.chunk_graphs[size, rows_per_pack] = (graph, logits, greedy)
        else:
            self.graphs[size, kind] = (graph, logits, greedy)
