"""Sequence-level KV block management over the block pools.

Check-then-act pairs keep the scheduler's preemption loop readable:
`can_allocate`/`allocate` (admission, with prefix-cache hits), `can_append`/`append_slots`
(growth), `can_swap_in`/`swap_in`, and `swap_out`/`free`.
"""
from __future__ import annotations

from dataclasses import dataclass

from .block_pool import BlockPool, HostBlockPool, block_hash
from .sequence import Sequence


@dataclass(slots=True)
class PrefixCacheCounters:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of those, tokens found cached


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    def __init__(self, num_blocks: int, num_host_blocks: int, block_size: int,
                 enable_prefix_caching: bool, watermark: float):
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.host_pool = HostBlockPool(num_host_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        self.watermark_blocks = int(watermark * num_blocks)
        self.prefix = PrefixCacheCounters()

    # --- admission ------------------------------------------------------------
    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks holding a prefix of the sequence. The last token is always
        computed, so that the step that admits the sequence yields its logits."""
        if not self.enable_prefix_caching:
            return []
        tokens = seq.token_ids
        hits: list[int] = []
        parent = None
        for i in range((len(tokens) - 1) // self.block_size):
            chunk = tuple(tokens[i * self.block_size : (i + 1) * self.block_size])
            h = block_hash(parent, chunk)
            block_id = self.pool.lookup(h, chunk)
            if block_id is None:
                break
            hits.append(block_id)
            parent = h
        return hits

    def num_blocks_to_admit(self, seq: Sequence) -> int:
        """Free blocks admitting `seq` would consume (new blocks + cached free hits)."""
        hits = self._prefix_hits(seq)
        idle_hits = sum(1 for b in hits if self.pool.blocks[b].ref_count == 0)
        return cdiv(seq.num_tokens, self.block_size) - len(hits) + idle_hits

    def can_allocate(self, seq: Sequence) -> bool:
        return self.pool.num_free_blocks - self.num_blocks_to_admit(seq) >= self.watermark_blocks

    def allocate(self, seq: Sequence) -> None:
        assert not seq.block_table
        hits = self._prefix_hits(seq)
        for block_id in hits:
            self.pool.touch(block_id)
        seq.block_table = hits + [self.pool.take() for _ in range(cdiv(seq.num_tokens, self.block_size) - len(hits))]
        seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_hashed_blocks = len(hits)
        self.prefix.queries += seq.num_tokens
        self.prefix.hits += seq.num_computed_tokens

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
        tokens = seq.token_ids
        num_full = seq.num_computed_tokens // self.block_size
        parent = self.pool.blocks[seq.block_table[seq.num_hashed_blocks - 1]].content_hash if seq.num_hashed_blocks else None
        for i in range(seq.num_hashed_blocks, num_full):
            chunk = tuple(tokens[i * self.block_size : (i + 1) * self.block_size])
            h = block_hash(parent, chunk)
            self.pool.register(seq.block_table[i], h, chunk)
            parent = h
        seq.num_hashed_blocks = max(seq.num_hashed_blocks, num_full)

    # --- release and swap -------------------------------------------------------
    def free(self, seq: Sequence) -> None:
        # Tail blocks first, so they sit nearer the head of the LRU queue than the
        # shared prefix blocks and are evicted before them.
        for block_id in reversed(seq.block_table):
            self.pool.release(block_id)
        seq.block_table = []
        seq.num_hashed_blocks = 0

    def can_swap_out(self, seq: Sequence) -> bool:
        return len(seq.block_table) <= self.host_pool.num_free_blocks

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        """Moves the sequence's KV to host blocks; returns (device, host) pairs to copy."""
        host = self.host_pool.take(len(seq.block_table))
        pairs = list(zip(seq.block_table, host))
        self.free(seq)
        seq.host_block_table = host
        return pairs

    def can_swap_in(self, seq: Sequence) -> bool:
        needed = cdiv(seq.num_tokens, self.block_size)
        return self.pool.num_free_blocks - needed >= self.watermark_blocks

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Brings the sequence back; returns (host, device) pairs to copy. The host
        blocks are released at once: the copy runs before anything can reuse them."""
        device = [self.pool.take() for _ in seq.host_block_table]
        device += [self.pool.take() for _ in range(cdiv(seq.num_tokens, self.block_size) - len(device))]
        pairs = list(zip(seq.host_block_table, device))
        self.host_pool.release(seq.host_block_table)
        seq.host_block_table = []
        seq.block_table = device
        seq.num_hashed_blocks = 0
        self.commit_full_blocks(seq)
        return pairs

    def release_host(self, seq: Sequence) -> None:
        self.host_pool.release(seq.host_block_table)
        seq.host_block_table = []

    # --- accounting -------------------------------------------------------------
    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_blocks - self.pool.num_free_blocks

    def usage(self) -> float:
        return self.num_used_blocks / self.pool.num_blocks
