"""The block pool on a tiny pool: exact block ids and free-queue order, as vLLM tests it."""

from __future__ import annotations

import pytest

from inferd.engine.kv.block_manager import BlockManager
from inferd.engine.kv.block_pool import BlockPool, block_hash
from inferd.engine.request.sampling_params import SamplingParams
from inferd.engine.request.sequence import Sequence


def seq(tokens, rid="r"):
    return Sequence(rid, 0, tokens, SamplingParams(), 0, 0.0, 0)


def test_take_in_order_and_release_puts_uncached_blocks_first():
    pool = BlockPool(4)
    assert [pool.take() for _ in range(3)] == [0, 1, 2]
    pool.register(1, block_hash(None, (1, 2)), (1, 2))
    pool.release(1)  # cached: goes to the tail
    pool.release(2)  # uncached: goes to the head
    assert list(pool.free_queue) == [2, 3, 1]
    assert pool.num_cached_free_blocks == 1


def test_reuse_evicts_cached_content():
    pool = BlockPool(1)
    b = pool.take()
    h = block_hash(None, (7,))
    pool.register(b, h, (7,))
    pool.release(b)
    assert pool.lookup(h, (7,)) == b
    assert pool.take() == b
    assert pool.lookup(h, (7,)) is None


def test_touch_removes_from_free_queue_and_release_below_zero_raises():
    pool = BlockPool(2)
    pool.touch(1)
    assert list(pool.free_queue) == [0]
    pool.release(1)
    with pytest.raises(RuntimeError, match="ref_count 0"):
        pool.release(1)


def admit(bm, s):
    bm.allocate(s)
    bm.append_slots(s, s.num_tokens)


def test_prefix_hit_shares_blocks_and_keeps_last_token_uncached():
    bm = BlockManager(num_blocks=8, num_host_blocks=0, block_size=4, enable_prefix_caching=True, watermark=0.0)
    a = seq(list(range(10)), "a")
    admit(bm, a)
    assert a.block_table == [0, 1, 2] and a.num_computed_tokens == 0
    a.num_computed_tokens = 10
    bm.commit_full_blocks(a)
    b = seq(list(range(8)) + [99], "b")
    admit(bm, b)
    assert b.block_table == [0, 1, 3] and b.num_computed_tokens == 8
    assert bm.pool.blocks[0].ref_count == 2
    # all 8 tokens cached, but the last must be computed: only one block is a hit
    c = seq(list(range(8)), "c")
    admit(bm, c)
    assert c.num_computed_tokens == 4 and c.block_table == [0, 4]
    for s in (a, b, c):
        bm.free(s)
    assert bm.pool.num_free_blocks == 8
    assert all(blk.ref_count == 0 for blk in bm.pool.blocks.values())


def test_watermark_blocks_admission():
    bm = BlockManager(num_blocks=10, num_host_blocks=0, block_size=4, enable_prefix_caching=False, watermark=0.2)
    assert bm.can_allocate(seq(list(range(40))), 32)  # first chunk of 32 tokens: 8 blocks, leaves 2 = watermark
    assert not bm.can_allocate(seq(list(range(40))), 33)  # 9 blocks


def test_swap_out_and_in_round_trip_ids():
    bm = BlockManager(num_blocks=4, num_host_blocks=4, block_size=4, enable_prefix_caching=False, watermark=0.0)
    s = seq(list(range(7)))
    admit(bm, s)
    assert s.block_table == [0, 1]
    pairs = bm.swap_out(s)
    assert pairs == [(("hot", 0, 0), ("hot", 0, 0)), (("hot", 1, 0), ("hot", 1, 0))]
    assert s.block_table == [] and bm.pool.num_free_blocks == 4
    back = bm.swap_in(s)
    assert [h for h, _ in back] == [("hot", 0, 0), ("hot", 1, 0)] and len(s.block_table) == 2
    assert bm.host_pool.num_free_blocks == 4


def test_cold_slots_share_a_page_and_return_it_when_empty():
    bm = BlockManager(
        num_blocks=6,
        num_host_blocks=4,
        block_size=4,
        enable_prefix_caching=True,
        watermark=0.0,
        slots_per_page={"int8": 2, "int4": 4},
    )
    s = seq(list(range(17)))
    admit(bm, s)
    assert s.block_table == [0, 1, 2, 3, 4]
    s.num_computed_tokens = 17
    bm.commit_full_blocks(s)
    pairs = bm.cool_blocks(s, hot_window=4, kind="int8")  # blocks 0-2 hold only tokens older than 13
    assert [hot for hot, _ in pairs] == [0, 1, 2]
    colds = [c for _, c in pairs]
    # page 5 splits into two int8 slots; freed hot pages go to the head of the queue
    assert [bm.pool.pages.locate(c) for c in colds] == [("int8", 5, 0), ("int8", 5, 1), ("int8", 1, 0)]
    assert s.block_table[:3] == colds
    # the quantized copy now answers prefix lookups: a new request shares it, no second quantization
    t = seq(list(range(9)), "t")
    bm.allocate(t)
    assert t.block_table == colds[:2]
    assert bm.cool_blocks(t, hot_window=0, kind="int8") == []
    bm.free(t)
    bm.free(s)
    assert bm.pool.num_free_blocks == 6
    assert all(b.ref_count == 0 for b in bm.pool.blocks.values())


def test_try_allocate_admits_with_one_lookup_pass_or_leaves_the_pool_alone():
    bm = BlockManager(num_blocks=6, num_host_blocks=0, block_size=4, enable_prefix_caching=True, watermark=0.0)
    a = seq(list(range(12)), "a")
    admit(bm, a)
    a.num_computed_tokens = 12
    bm.commit_full_blocks(a)
    lookups = []
    lookup = bm.pool.lookup
    bm.pool.lookup = lambda h, t: lookups.append(h) or lookup(h, t)
    b = seq(list(range(8)) + [50, 51], "b")  # 2 cached blocks, then 2 tokens to compute
    assert bm.try_allocate(b, 2)
    assert b.block_table == [0, 1] and b.num_computed_tokens == 8
    assert len(lookups) == 2  # one pass for the check and the admission
    free_before = bm.pool.num_free_blocks  # 3: a's blocks are still held
    too_big = seq(list(range(100, 120)), "c")  # 5 blocks needed
    assert not bm.try_allocate(too_big, 20)
    assert too_big.block_table == [] and bm.pool.num_free_blocks == free_before
