"""Property-based: random add/step/abort sequences never break block accounting."""

from __future__ import annotations

import collections

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from inferd.engine import EngineConfig, LLMEngine, SamplingParams
from inferd.engine.request.sequence import SequenceStatus


@pytest.fixture(scope="module")
def engine_factory(tiny_model):
    probe = LLMEngine(EngineConfig(model=tiny_model, block_size=8, kv_cache_bytes=1 << 20))

    def build(mode: str, caching: bool, cold: str) -> LLMEngine:
        return LLMEngine(
            EngineConfig(
                model=tiny_model,
                block_size=8,
                kv_cache_bytes=20 * probe.block_bytes,
                swap_space_bytes=12 * probe.block_bytes,
                preemption_mode=mode,
                enable_prefix_caching=caching,
                max_num_batched_tokens=32,
                watermark=0.0,
                kv_cold_dtype=cold,
                kv_hot_window=8,
            )
        )

    return build


def check_invariants(engine: LLMEngine) -> None:
    pool = engine.block_manager.pool
    holders: dict[int, int] = {}
    live = [s for r in engine.requests.values() for s in r.seqs if not s.is_finished]
    for s in live:
        for b in s.block_table:
            holders[b] = holders.get(b, 0) + 1
        if s.status is SequenceStatus.SWAPPED:
            assert not s.block_table and s.host_block_table
    pages = pool.pages
    # The running counts the metrics read equal a walk of the pool.
    walked = collections.Counter(pages.locate(b)[0] for b, block in pool.blocks.items() if block.ref_count > 0)
    assert +pool.live_by_kind == walked
    assert pool.num_cached_free_blocks == sum(1 for p in pages.free_queue if pool.blocks[p].content_hash is not None)
    cold_slots_per_page: dict[int, int] = {}
    for block_id, block in pool.blocks.items():
        assert block.ref_count >= 0
        assert block.ref_count == holders.get(block_id, 0)
        if pool.is_cold(block_id):
            assert block.ref_count > 0  # cold blocks are freed with their last reference
            kind, page, _ = pages.locate(block_id)
            cold_slots_per_page[page] = cold_slots_per_page.get(page, 0) + 1
    for page in range(pages.num_pages):
        in_free = page in pages.free_queue
        if page in cold_slots_per_page:
            assert not in_free and pages.page_used_slots[page] == cold_slots_per_page[page]
        else:
            assert in_free == (pool.blocks[page].ref_count == 0)
    # a block in two tables must hold a full, hashed (prefix-shared) block
    for b, n in holders.items():
        if n > 1:
            assert pool.blocks[b].content_hash is not None
    # Swapped-out cold blocks keep their compact form: several share one host page.
    host = engine.block_manager.host_pool
    host_blocks = [b for s in live for b in s.host_block_table]
    assert len(set(host_blocks)) == len(host_blocks)  # the host pool shares nothing
    host_pages = {host.pages.locate(b)[1] for b in host_blocks}
    assert len(host_pages) == host.num_blocks - host.num_free_blocks


action = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 40), st.integers(1, 20), st.integers(0, 2), st.integers(1, 2)),
    st.tuples(st.just("step"), st.integers(1, 4)),
    st.tuples(st.just("abort"), st.integers(0, 30)),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    actions=st.lists(action, min_size=5, max_size=40),
    mode=st.sampled_from(["swap", "recompute"]),
    caching=st.booleans(),
    cold=st.sampled_from(["none", "int8", "int4"]),
)
# Found by hypothesis: swapped-out int4 blocks share host pages (the invariant once counted blocks).
@example(
    actions=[("add", 1, 1, 0, 1)] * 6 + [("add", 1, 9, 0, 1)] + [("add", 1, 9, 0, 2)] * 3 + [("add", 10, 9, 0, 2)],
    mode="swap",
    caching=False,
    cold="int4",
)
def test_random_workloads_keep_blocks_consistent(engine_factory, actions, mode, caching, cold):
    engine = engine_factory(mode, caching, cold)
    ids = []
    for act in actions:
        if act[0] == "add":
            _, length, max_tokens, prio, n = act
            rid = f"r{len(ids)}"
            prompt = [(7 * i + len(ids) % 3) % 400 + 5 for i in range(length)]  # shared prefixes across requests
            engine.add_request(
                rid, prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, n=n, ignore_eos=True), priority=prio
            )
            ids.append(rid)
        elif act[0] == "step":
            for _ in range(act[1]):
                engine.step()
                check_invariants(engine)
        elif ids:
            engine.abort(ids[act[1] % len(ids)])
            check_invariants(engine)
    while engine.has_unfinished():
        engine.step()
        check_invariants(engine)
    bm = engine.block_manager
    assert bm.pool.num_free_blocks == bm.pool.num_blocks  # every block free or cached
    assert bm.host_pool.num_free_blocks == bm.host_pool.num_blocks


def test_fragmentation_is_the_unfilled_tails_not_a_full_pool(tiny_model):
    """A pool filled by one long request with another waiting is full, not fragmented:
    the ratio counts only the unfilled slots of the running sequences' last blocks."""
    from inferd.engine import EngineConfig, LLMEngine, SamplingParams

    probe = LLMEngine(EngineConfig(model=tiny_model, block_size=8))
    engine = LLMEngine(
        EngineConfig(
            model=tiny_model,
            block_size=8,
            kv_cache_bytes=12 * probe.block_bytes,
            watermark=0.0,
            swap_space_bytes=0,
            preemption_mode="recompute",
        )
    )
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    engine.add_request("long", [5] * 75, params)  # 10 blocks: 76 of 80 slots once it has decoded one token
    engine.step()
    engine.add_request("waits", [6] * 40, params)  # 5 blocks: does not fit beside it
    engine.step()
    snapshot = engine.kv_snapshot()
    assert engine.scheduler.waiting and snapshot.num_free < 5
    used_slots = snapshot.num_used * 8
    assert snapshot.fragmentation_ratio == (used_slots - 77) / used_slots
