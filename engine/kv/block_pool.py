"""The KV block pool: pages, cold slots, reference counts, the free queue, the prefix index.

Memory is one budget of equal *pages*. A hot block (full precision) fills a page; a
cold block (int8 or int4) fills one *slot* of a page that has been split into
`slots_per_page[kind]` slots of that kind. Block ids: a hot block's id is its page
number, in [0, num_pages); a cold block's id is ``num_pages + page * MAX_SLOTS + slot``.

Invariants (checked by tests/test_block_pool.py and tests/test_block_accounting.py):
- A block's ref_count is the number of block tables holding it; never negative.
- A page is in the free queue exactly when it holds no live hot block and no live
  cold slot.
- The free queue is an LRU list (an OrderedDict is a linked list with O(1) removal
  from the middle, needed when a cached block is hit again): pages are taken from its
  head. Pages freed without a hash go to the head (nothing to lose), hot blocks with a
  hash to the tail, so the least recently used cached content is evicted first.
- `hash_to_block` maps a full block's content hash (parent hash + its token ids) to a
  block holding that content, hot or cold. A cold block whose last reference goes is
  freed at once (its slot is not kept as a cache entry, so that a page never stays
  pinned by one cached slot); a hot one stays cached until its page is reused.
- `live_by_kind` counts the blocks with references per kind and `num_cached_free_blocks`
  the free pages still holding a hashed hot block; both are kept as blocks change, so
  reading them (every metrics snapshot) never walks the pool.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

HOT = "hot"
MAX_SLOTS = 16
KIND_CODE = {HOT: 0, "int8": 1, "int4": 2}  # as attention metadata carries block kinds

BlockLocation: TypeAlias = tuple[str, int, int]  # where a block's KV lives: (kind, page, slot)
BlockCopy: TypeAlias = tuple[BlockLocation, BlockLocation]  # (from, to), as swaps and host resizes copy KV


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    content_hash: int | None = None
    token_ids: tuple[int, ...] = ()


def block_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


class PageAllocator:
    """Pages and the cold slots carved from them; no hashing (the host pool uses it as is)."""

    def __init__(self, num_pages: int, slots_per_page: dict[str, int] | None = None):
        self.num_pages = num_pages
        self.slots_per_page = {HOT: 1, **(slots_per_page or {})}
        if any(n > MAX_SLOTS for n in self.slots_per_page.values()):
            raise ValueError(f"at most {MAX_SLOTS} cold slots per page")
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_pages))
        self.page_kind: list[str | None] = [None] * num_pages
        self.page_kind_code = np.zeros(num_pages, dtype=np.int64)  # KIND_CODE of each page, 0 when free
        self.page_used_slots: list[int] = [0] * num_pages  # live slots, cold pages only
        self.open_pages: dict[str, list[int]] = {k: [] for k in self.slots_per_page if k != HOT}
        self.free_slots: dict[int, list[int]] = {}  # cold page -> free slot numbers

    @property
    def num_free_pages(self) -> int:
        return len(self.free_queue)

    # ids -----------------------------------------------------------------------
    def cold_id(self, page: int, slot: int) -> int:
        return self.num_pages + page * MAX_SLOTS + slot

    def is_cold(self, block_id: int) -> bool:
        return block_id >= self.num_pages

    def locate(self, block_id: int) -> BlockLocation:
        """(kind, page, slot) of a block id; a cold id must be in a page that is in use."""
        if block_id < self.num_pages:
            return HOT, block_id, 0
        page, slot = divmod(block_id - self.num_pages, MAX_SLOTS)
        kind = self.page_kind[page]
        assert kind is not None, f"cold block {block_id} is in free page {page}"
        return kind, page, slot

    def locate_table(self, block_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorised `locate` over an array of block ids: (kind codes, pages, slots)."""
        cold = block_ids >= self.num_pages
        offset = np.where(cold, block_ids - self.num_pages, 0)
        pages = np.where(cold, offset // MAX_SLOTS, block_ids)
        slots = np.where(cold, offset % MAX_SLOTS, 0)
        kinds = np.where(cold, self.page_kind_code[pages], 0)
        return kinds, pages, slots

    # pages -----------------------------------------------------------------------
    def _take_page(self, kind: str) -> int:
        page, _ = self.free_queue.popitem(last=False)
        self.page_kind[page] = kind
        self.page_kind_code[page] = KIND_CODE[kind]
        return page

    def _return_page(self, page: int, to_head: bool) -> None:
        self.page_kind[page] = None
        self.page_kind_code[page] = 0
        self.free_queue[page] = None
        if to_head:
            self.free_queue.move_to_end(page, last=False)

    def pages_needed(self, kinds: list[str]) -> int:
        """Free pages that blocks of these kinds would take (spare slots of open pages first)."""
        pages = 0
        for kind in set(kinds):
            n = kinds.count(kind)
            if kind == HOT:
                pages += n
                continue
            spare = sum(len(self.free_slots[p]) for p in self.open_pages[kind])
            pages += max(0, -(-(n - spare) // self.slots_per_page[kind]))
        return pages

    def take_hot(self) -> int:
        return self._take_page(HOT)

    def release_hot(self, page: int, to_head: bool = True) -> None:
        self._return_page(page, to_head)

    def can_take_cold(self, kind: str) -> bool:
        return bool(self.open_pages[kind]) or bool(self.free_queue)

    def take_cold(self, kind: str) -> int:
        if kind not in self.open_pages:
            raise ValueError(f"unknown cold block kind {kind!r}; known: {', '.join(self.open_pages)}")
        if not self.open_pages[kind]:
            page = self._take_page(kind)
            self.free_slots[page] = list(range(self.slots_per_page[kind] - 1, -1, -1))
            self.open_pages[kind].append(page)
        page = self.open_pages[kind][-1]
        slot = self.free_slots[page].pop()
        self.page_used_slots[page] += 1
        if not self.free_slots[page]:
            self.open_pages[kind].pop()
        return self.cold_id(page, slot)

    def release_cold(self, block_id: int) -> None:
        kind, page, slot = self.locate(block_id)
        slots = self.free_slots[page]
        if not slots:
            self.open_pages[kind].append(page)
        slots.append(slot)
        self.page_used_slots[page] -= 1
        if self.page_used_slots[page] == 0:
            self.open_pages[kind].remove(page)
            del self.free_slots[page]
            self._return_page(page, to_head=True)


class PagedPool:
    """What the device and host pools share: their pages and how many there are."""

    def __init__(self, num_blocks: int, slots_per_page: dict[str, int] | None = None):
        self.pages = PageAllocator(num_blocks, slots_per_page)

    @property
    def num_blocks(self) -> int:
        return self.pages.num_pages

    @property
    def num_free_blocks(self) -> int:
        return self.pages.num_free_pages

    def is_cold(self, block_id: int) -> bool:
        return self.pages.is_cold(block_id)


class BlockPool(PagedPool):
    """Device pool: pages plus reference counts and the prefix-cache index."""

    def __init__(self, num_blocks: int, slots_per_page: dict[str, int] | None = None):
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        super().__init__(num_blocks, slots_per_page)
        self.blocks: dict[int, Block] = {i: Block(i) for i in range(num_blocks)}
        self.hash_to_block: dict[int, int] = {}
        self.live_by_kind: Counter[str] = Counter()  # blocks with ref_count > 0, per kind
        self._num_cached_free = 0

    @property
    def free_queue(self) -> OrderedDict[int, None]:
        return self.pages.free_queue

    @property
    def num_cached_free_blocks(self) -> int:
        return self._num_cached_free

    def _is_cached_free(self, page: int) -> bool:
        return page in self.pages.free_queue and self.blocks[page].content_hash is not None

    def lookup(self, content_hash: int, token_ids: tuple[int, ...]) -> int | None:
        block_id = self.hash_to_block.get(content_hash)
        if block_id is None or self.blocks[block_id].token_ids != token_ids:
            return None
        return block_id

    def take(self) -> int:
        """A free page for a new hot block; evicts the page's cached content if any."""
        page = next(iter(self.pages.free_queue))
        self._num_cached_free -= self._is_cached_free(page)
        self.pages.take_hot()
        block = self.blocks[page]
        self._forget_hash(block)
        block.ref_count = 1
        self.live_by_kind[HOT] += 1
        return page

    def can_take_cold(self, kind: str) -> bool:
        return self.pages.can_take_cold(kind)

    def take_cold(self, kind: str) -> int:
        # Taking a fresh page evicts whatever hot content it cached.
        if not self.pages.open_pages[kind] and self.pages.free_queue:
            page = next(iter(self.pages.free_queue))
            self._num_cached_free -= self._is_cached_free(page)
            self._forget_hash(self.blocks[page])
        block_id = self.pages.take_cold(kind)
        self.blocks[block_id] = Block(block_id, ref_count=1)
        self.live_by_kind[kind] += 1
        return block_id

    def touch(self, block_id: int) -> None:
        """Take a reference on a block found in the prefix cache."""
        block = self.blocks[block_id]
        if block.ref_count == 0:  # only hot blocks linger at 0 references
            self._num_cached_free -= self._is_cached_free(block_id)
            self.live_by_kind[HOT] += 1
            del self.pages.free_queue[block_id]
            self.pages.page_kind[block_id] = HOT
            self.pages.page_kind_code[block_id] = KIND_CODE[HOT]
        block.ref_count += 1

    def release(self, block_id: int) -> None:
        block = self.blocks.get(block_id)
        if block is None or block.ref_count <= 0:
            raise RuntimeError(f"block {block_id} released with ref_count {block.ref_count if block else 0}")
        block.ref_count -= 1
        if block.ref_count > 0:
            return
        kind = self.pages.locate(block_id)[0]
        self.live_by_kind[kind] -= 1
        if self.pages.is_cold(block_id):
            self._forget_hash(block)
            del self.blocks[block_id]
            self.pages.release_cold(block_id)  # a page it empties goes back with no hashed block
            return
        if block.content_hash is not None and self.hash_to_block.get(block.content_hash) != block_id:
            self._forget_hash(block)  # a quantized copy now answers for this content
        self.pages.release_hot(block_id, to_head=block.content_hash is None)
        self._num_cached_free += block.content_hash is not None

    def register(self, block_id: int, content_hash: int, token_ids: tuple[int, ...], prefer: bool = False) -> None:
        """Record a full block's content. `prefer` points the hash at this block even if
        another holds the same content (a freshly quantized copy replaces the hot one)."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            raise RuntimeError(f"block {block_id} registered with no reference")
        block.content_hash = content_hash
        block.token_ids = token_ids
        if prefer:
            self.hash_to_block[content_hash] = block_id
        else:
            self.hash_to_block.setdefault(content_hash, block_id)

    def _forget_hash(self, block: Block) -> None:
        if block.content_hash is not None and self.hash_to_block.get(block.content_hash) == block.block_id:
            del self.hash_to_block[block.content_hash]
        block.content_hash = None
        block.token_ids = ()


class HostBlockPool(PagedPool):
    """Host (swap) pool: same page format as the device, no sharing, no caching."""

    def can_take(self, kinds: list[str]) -> bool:
        return self.pages.pages_needed(kinds) <= self.pages.num_free_pages

    def take(self, kind: str) -> int:
        return self.pages.take_hot() if kind == HOT else self.pages.take_cold(kind)

    def release(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            if self.is_cold(block_id):
                self.pages.release_cold(block_id)
            else:
                self.pages.release_hot(block_id)
