"""Sequence-level KV block management over the block pools.

Check-then-act pairs keep the scheduler's preemption loop readable:
`can_allocate`/`allocate` (admission, with prefix-cache hits; `try_allocate` is both with
one lookup pass), `can_append`/`append_slots` (growth), `can_swap_out`/`swap_out`,
`can_swap_in`/`swap_in`, and `free`.
New tokens always go to hot blocks; `cool_blocks` moves a sequence's full blocks that
have left the hot window to cold (quantized) blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..request.sequence import Sequence
from .block_pool import HOT, BlockCopy, BlockLocation, BlockPool, HostBlockPool, block_hash


@dataclass(slots=True)
class PrefixCacheCounters:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of those, tokens found cached


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def token_slots(block_table: list[int], block_size: int, start: int, end: int) -> list[int]:
    """KV slots of positions start..end-1: block_table[pos // block_size] * block_size +
    pos % block_size, a range per block (a 16 x 512-token step is 8,192 positions: with
    a Python loop over them, ModelRunner.prepare() took 2.9-4.4 ms of every such step on
    the H200's host, the device idle meanwhile)."""
    slots: list[int] = []
    pos = start
    while pos < end:
        block = pos // block_size
        upto = min(end, (block + 1) * block_size)
        offset = (block_table[block] - block) * block_size  # slot = pos + offset within the block
        slots.extend(range(pos + offset, upto + offset))
        pos = upto
    return slots


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        num_host_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        watermark: float,
        slots_per_page: dict[str, int] | None = None,
    ):
        self.block_size = block_size
        self.slots_per_page = slots_per_page or {}
        self.pool = BlockPool(num_blocks, self.slots_per_page)
        self.host_pool = HostBlockPool(num_host_blocks, self.slots_per_page)
        self.enable_prefix_caching = enable_prefix_caching
        self.watermark_blocks = int(watermark * num_blocks)
        self.prefix = PrefixCacheCounters()

    # --- admission ------------------------------------------------------------
    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks holding a prefix of the sequence. The last token is always
        computed, so that the step that admits the sequence yields its logits. None for a
        sequence that asks for prompt logprobs: cached blocks have no logits to score
        (engine/request/prompt_logprobs.py)."""
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return []
        hits: list[int] = []
        for h, chunk in self._block_hashes(seq, (seq.num_tokens - 1) // self.block_size):
            block_id = self.pool.lookup(h, chunk)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _block_hashes(self, seq: Sequence, num_blocks: int) -> list[tuple[int, tuple[int, ...]]]:
        """(chained hash, tokens) of the sequence's first `num_blocks` full blocks. A waiting
        sequence asks at each step until it is admitted, and registration once more: a
        2,048-token prompt is 128 tuples and hashes each time otherwise."""
        memo, bs = seq.block_hashes, self.block_size
        parent = memo[-1][0] if memo else None
        for i in range(len(memo), num_blocks):
            chunk = tuple(seq.tokens(i * bs, (i + 1) * bs))
            parent = block_hash(parent, chunk)
            memo.append((parent, chunk))
        return memo[:num_blocks]

    def num_blocks_to_admit(self, seq: Sequence, num_new_tokens: int, hits: list[int] | None = None) -> int:
        """Free pages admitting `seq` and computing `num_new_tokens` of it would take
        (`hits`: its prefix hits, when the caller has them)."""
        hits = self._prefix_hits(seq) if hits is None else hits
        idle_hits = sum(1 for b in hits if self.pool.blocks[b].ref_count == 0)
        hit_tokens = len(hits) * self.block_size
        total = min(seq.num_tokens, hit_tokens + num_new_tokens)
        return cdiv(total, self.block_size) - len(hits) + idle_hits

    def can_allocate(self, seq: Sequence, num_new_tokens: int, hits: list[int] | None = None) -> bool:
        needed = self.num_blocks_to_admit(seq, num_new_tokens, hits)
        return self.pool.num_free_blocks - needed >= self.watermark_blocks

    def allocate(self, seq: Sequence, hits: list[int] | None = None) -> None:
        """Admit: take the cached prefix blocks. Blocks for the tokens to compute come
        from `append_slots`, chunk by chunk, as the prompt is prefilled."""
        assert not seq.block_table
        hits = self._prefix_hits(seq) if hits is None else hits
        for block_id in hits:
            self.pool.touch(block_id)
        seq.block_table = hits
        seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_hashed_blocks = len(hits)
        self.prefix.queries += seq.num_tokens
        self.prefix.hits += seq.num_computed_tokens

    def try_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """`allocate` if `can_allocate`, with one pass of prefix-cache lookups (128 for a
        2,048-token cached prefix) for both."""
        hits = self._prefix_hits(seq)
        if not self.can_allocate(seq, num_new_tokens, hits):
            return False
        self.allocate(seq, hits)
        return True

    # --- growth ---------------------------------------------------------------
    def num_new_blocks(self, seq: Sequence, num_tokens: int) -> int:
        return max(0, cdiv(num_tokens, self.block_size) - len(seq.block_table))

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        """Can the sequence hold `num_tokens` tokens in total?"""
        return self.num_new_blocks(seq, num_tokens) <= self.pool.num_free_blocks

    def append_slots(self, seq: Sequence, num_tokens: int) -> None:
        for _ in range(self.num_new_blocks(seq, num_tokens)):
            seq.block_table.append(self.pool.take())

    def commit_full_blocks(self, seq: Sequence) -> None:
        """Register blocks that became full (and computed) in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_hashed_blocks:
            return
        hashes = self._block_hashes(seq, num_full)
        for i in range(seq.num_hashed_blocks, num_full):
            h, chunk = hashes[i]
            self.pool.register(seq.block_table[i], h, chunk)
        seq.num_hashed_blocks = max(seq.num_hashed_blocks, num_full)

    def cool_blocks(self, seq: Sequence, hot_window: int, kind: str) -> list[tuple[int, int]]:
        """Replace the sequence's hot blocks whose tokens are all older than the hot
        window by cold blocks of `kind`. Returns (hot, cold) pairs to quantize. A block
        is never quantized twice: a shared block already quantized for another
        sequence is found by its hash and shared again."""
        pairs: list[tuple[int, int]] = []
        num_old = max(0, seq.num_computed_tokens - hot_window) // self.block_size
        for i in range(seq.num_cold_scanned, num_old):
            hot = seq.block_table[i]
            if self.pool.is_cold(hot):
                seq.num_cold_scanned = i + 1
                continue
            block = self.pool.blocks[hot]
            existing = self.pool.lookup(block.content_hash, block.token_ids) if block.content_hash is not None else None
            if existing is not None and self.pool.is_cold(existing):
                self.pool.touch(existing)
                cold = existing
            elif self.pool.can_take_cold(kind):
                cold = self.pool.take_cold(kind)
                if block.content_hash is not None:
                    self.pool.register(cold, block.content_hash, block.token_ids, prefer=True)
                pairs.append((hot, cold))
            else:
                break  # no memory for a cold block now; try again next step
            seq.block_table[i] = cold
            self.pool.release(hot)
            seq.num_cold_scanned = i + 1
        return pairs

    # --- release and swap -------------------------------------------------------
    def free(self, seq: Sequence) -> None:
        # Tail blocks first, so they sit nearer the head of the LRU queue than the
        # shared prefix blocks and are evicted before them.
        for block_id in reversed(seq.block_table):
            self.pool.release(block_id)
        seq.block_table = []
        seq.num_hashed_blocks = 0
        seq.num_cold_scanned = 0

    def _kinds(self, pool: BlockPool | HostBlockPool, block_ids: list[int]) -> list[str]:
        return [pool.pages.locate(b)[0] for b in block_ids]

    def can_swap_out(self, seq: Sequence) -> bool:
        return self.host_pool.can_take(self._kinds(self.pool, seq.block_table))

    def swap_out(self, seq: Sequence) -> list[BlockCopy]:
        """Moves the sequence's KV to host blocks of the same kinds (cold blocks keep their
        compact form); returns ((kind, page, slot) device, (kind, page, slot) host) pairs."""
        host = [self.host_pool.take(kind) for kind in self._kinds(self.pool, seq.block_table)]
        pairs = [(self.pool.pages.locate(d), self.host_pool.pages.locate(h)) for d, h in zip(seq.block_table, host)]
        self.free(seq)
        seq.host_block_table = host
        return pairs

    def can_swap_in(self, seq: Sequence) -> bool:
        needed = self.pool.pages.pages_needed(self._kinds(self.host_pool, seq.host_block_table))
        return self.pool.num_free_blocks - needed >= self.watermark_blocks

    def swap_in(self, seq: Sequence) -> list[BlockCopy]:
        """Brings the sequence back; returns ((kind, page, slot) host, device) pairs to
        copy. The host blocks are released at once: the copy runs before anything can
        reuse them."""
        kinds = self._kinds(self.host_pool, seq.host_block_table)
        device = [self.pool.take() if kind == HOT else self.pool.take_cold(kind) for kind in kinds]
        pairs = [
            (self.host_pool.pages.locate(h), self.pool.pages.locate(d)) for h, d in zip(seq.host_block_table, device)
        ]
        self.host_pool.release(seq.host_block_table)
        seq.host_block_table = []
        seq.block_table = device
        seq.num_hashed_blocks = 0
        seq.num_cold_scanned = 0
        self.commit_full_blocks(seq)
        return pairs

    def release_host(self, seq: Sequence) -> None:
        self.host_pool.release(seq.host_block_table)
        seq.host_block_table = []

    def plan_host_resize(self, num_blocks: int, swapped: list[Sequence]) -> HostResize:
        """A host pool of `num_blocks` holding the swapped-out sequences' blocks, planned
        without changing anything: `remap` (old (kind, page, slot) -> new) is the copies
        the KV cache must make; `commit` switches to the new pool."""
        new_pool = HostBlockPool(num_blocks, self.slots_per_page)
        remap: dict[BlockLocation, BlockLocation] = {}
        tables: list[tuple[Sequence, list[int]]] = []
        for seq in swapped:
            new_ids = []
            for block_id in seq.host_block_table:
                old = self.host_pool.pages.locate(block_id)
                new_id = new_pool.take(old[0])
                remap[old] = new_pool.pages.locate(new_id)
                new_ids.append(new_id)
            tables.append((seq, new_ids))
        return HostResize(self, new_pool, remap, tables)

    # --- accounting -------------------------------------------------------------
    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_blocks - self.pool.num_free_blocks

    def usage(self) -> float:
        return self.num_used_blocks / self.pool.num_blocks

    def blocks_by_kind(self) -> dict[str, int]:
        """Live blocks (referenced by some sequence) per kind: hot, int8, int4."""
        counts = {HOT: 0, **{k: 0 for k in self.slots_per_page}}
        counts.update(self.pool.live_by_kind)
        return counts


@dataclass(slots=True)
class HostResize:
    """A planned host-pool resize (BlockManager.plan_host_resize); nothing changes until commit."""

    manager: BlockManager
    new_pool: HostBlockPool
    remap: dict[BlockLocation, BlockLocation]
    tables: list[tuple[Sequence, list[int]]]

    def commit(self) -> None:
        for seq, new_ids in self.tables:
            seq.host_block_table = new_ids
        self.manager.host_pool = self.new_pool
