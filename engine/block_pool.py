"""The KV block pool: reference counts, the free queue, and the prefix-cache index.

Invariants (checked by tests/test_block_pool.py):
- A block's ref_count is the number of block tables holding it; it is never negative.
- A block is in the free queue exactly when its ref_count is 0.
- The free queue is an LRU list (an OrderedDict is a linked list with O(1) removal
  from the middle, needed when a cached block is hit again): blocks are taken from
  its head. Blocks freed without a hash go to the head (nothing to lose), blocks with
  a hash to the tail, so the least recently used cached content is evicted first.
- `hash_to_block` maps a full block's content hash (parent hash + its token ids) to a
  block holding that content; the entry is dropped when the block is reused.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    content_hash: int | None = None
    token_ids: tuple[int, ...] = ()


def block_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


class BlockPool:
    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_cached_free_blocks(self) -> int:
        return sum(1 for b in self.free_queue if self.blocks[b].content_hash is not None)

    def lookup(self, content_hash: int, token_ids: tuple[int, ...]) -> int | None:
        block_id = self.hash_to_block.get(content_hash)
        if block_id is None or self.blocks[block_id].token_ids != token_ids:
            return None
        return block_id

    def take(self) -> int:
        """A free block for new content; evicts its cached content if it had any."""
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        self._forget_hash(block)
        block.ref_count = 1
        return block_id

    def touch(self, block_id: int) -> None:
        """Take a reference on a block found in the prefix cache."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_queue[block_id]
        block.ref_count += 1

    def release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count <= 0:
            raise RuntimeError(f"block {block_id} released with ref_count {block.ref_count}")
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_queue[block_id] = None
            if block.content_hash is None:
                self.free_queue.move_to_end(block_id, last=False)

    def register(self, block_id: int, content_hash: int, token_ids: tuple[int, ...]) -> None:
        block = self.blocks[block_id]
        block.content_hash = content_hash
        block.token_ids = token_ids
        self.hash_to_block.setdefault(content_hash, block_id)

    def _forget_hash(self, block: Block) -> None:
        if block.content_hash is not None and self.hash_to_block.get(block.content_hash) == block.block_id:
            del self.hash_to_block[block.content_hash]
        block.content_hash = None
        block.token_ids = ()


class HostBlockPool:
    """Free list of host (swap) blocks; no sharing, no caching."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"host pool has {len(self._free)} free blocks, {n} asked")
        return [self._free.pop() for _ in range(n)]

    def release(self, block_ids: list[int]) -> None:
        self._free.extend(reversed(block_ids))
