"""GPU fast path, the parts that run without a GPU: imports and availability, the
CUDA-graph ladder and padding, fallback switching through injected failures, and the
Triton kernels' indexing under Triton's CPU interpreter (float32; the interpreter has
no bfloat16), down to a whole fused decode step against the portable model."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from inferd.engine import LLM, SamplingParams
from inferd.engine.fast_path import GRAPH_LADDER, attach_fast_path, graph_batch_size, has_triton, unavailable_reason
from inferd.engine.fast_path.cuda_graphs import PAD_SLOT, DecodeGraphs, DecodeInputs, is_pure_decode
from inferd.engine.fast_path.gpu_sampling import can_sample_greedy_on_device
from inferd.engine.fast_path.greedy_head import greedy_with_flag_reference
from inferd.engine.runner.runner_output import RunnerOutput
from inferd.engine.runner.runner_protocol import ModelRunnerProtocol

from attention_reference import reference_attention

needs_triton = pytest.mark.skipif(
    not has_triton() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton (pip) with TRITON_INTERPRET=1 for its CPU interpreter",
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [30, 31, 32], [40]]


def assert_same_completion(got, want, tol: float = 1e-4) -> None:
    """Same tokens, and the same top log-probabilities at every step within `tol`."""
    assert got.token_ids == want.token_ids
    for lp_g, lp_w in zip(got.logprobs, want.logprobs):
        assert lp_g.keys() == lp_w.keys()
        assert all(abs(lp_g[t] - lp_w[t]) < tol for t in lp_w)


# --- availability -------------------------------------------------------------------
def test_unavailable_on_cpu_with_reason():
    assert "CUDA" in unavailable_reason(torch.device("cpu"), torch.bfloat16)


def test_engine_on_cpu_stays_portable(tiny_model):
    llm = LLM(tiny_model)
    assert isinstance(llm.engine.runner, ModelRunnerProtocol)  # everything the engine uses of a runner
    assert llm.engine.fast_path_unavailable is not None
    assert llm.engine.runner.fast_decode is None
    assert attach_fast_path(llm.engine.runner, 128) == llm.engine.fast_path_unavailable


# --- graph ladder -------------------------------------------------------------------
@pytest.mark.parametrize("n, size", [(1, 1), (2, 2), (3, 4), (5, 8), (31, 32), (33, 64), (200, 256), (256, 256)])
def test_graph_batch_size_picks_next_rung(n, size):
    assert graph_batch_size(n) == size


def test_graph_batch_size_beyond_ladder_runs_eagerly_and_zero_is_refused():
    assert graph_batch_size(257) is None
    assert graph_batch_size(3, ladder=(8, 2)) == 8
    with pytest.raises(ValueError, match="num_seqs"):
        graph_batch_size(0)


@given(st.integers(1, 300))
def test_graph_batch_size_is_smallest_rung_that_fits(n):
    size = graph_batch_size(n)
    fitting = [r for r in GRAPH_LADDER if r >= n]
    assert size == (min(fitting) if fitting else None)


def _decoding_batch(llm, prompts):
    """Run prefill so each sequence is one decode token away; returns the scheduled batch."""
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    while True:
        sched = engine.scheduler.schedule()
        if is_pure_decode(sched.scheduled):
            return sched.scheduled
        logits = engine.runner.execute(sched.scheduled).logits
        sampling = [item.seq for item in sched.scheduled if item.completes]
        for item in sched.scheduled:
            item.seq.num_computed_tokens += item.num_tokens
        for seq, row in zip(sampling, logits):
            seq.append_token(int(row.argmax()))


def test_decode_inputs_and_padding(tiny_model):
    llm = LLM(tiny_model, block_size=8)
    batch = _decoding_batch(llm, PROMPTS)
    rows = DecodeInputs.from_batch(batch, 8)
    for i, item in enumerate(batch):
        seq = item.seq
        pos = seq.num_computed_tokens
        assert rows.input_ids[i] == seq.token_ids[pos] and rows.positions[i] == pos
        assert rows.context_lens[i] == pos + 1
        assert rows.slots[i] == seq.block_table[pos // 8] * 8 + pos % 8
    padded = rows.padded(4)
    assert padded.slots[3] == PAD_SLOT and padded.context_lens[3] == 0 and padded.block_tables[3] == []
    with pytest.raises(ValueError, match="do not fit"):
        rows.padded(2)


def test_is_pure_decode_rejects_prefill_chunks(tiny_model):
    llm = LLM(tiny_model)
    llm.engine.add_request("p", PROMPTS[0], GREEDY)
    sched = llm.engine.scheduler.schedule()
    assert not is_pure_decode(sched.scheduled)
    assert not is_pure_decode([])


def test_device_greedy_only_for_plain_greedy_on_cuda(tiny_model):
    llm = LLM(tiny_model)
    batch = _decoding_batch(llm, PROMPTS[:1])
    seqs = [item.seq for item in batch]
    assert not can_sample_greedy_on_device(torch.zeros(1, 8), seqs)  # CPU logits: host sampler


# --- fallback switching -------------------------------------------------------------
class FakeDecode:
    """Stands in for DecodeGraphs: counts calls and fails or returns what it is told."""

    decoder = None  # no fused forward: prefill and mixed steps run the model's own

    def __init__(self, runner, behaviour):
        self.runner, self.behaviour, self.calls = runner, behaviour, 0

    def can_run(self, batch):
        return is_pure_decode(batch)

    def execute(self, batch):
        self.calls += 1
        if self.behaviour == "raise":
            raise RuntimeError("kernel launch failed")
        input_ids, meta, rows = self.runner.prepare(batch)
        logits = self.runner._forward(input_ids, meta, rows, self.runner.fast_attention, check=False)
        logits = logits * float("nan") if self.behaviour == "nan" else logits
        self.packed = greedy_with_flag_reference(logits)  # what the real graphs compute in the step
        return logits

    def greedy(self, num_rows):
        return self.packed[: num_rows + 1]


@pytest.mark.parametrize(
    "behaviour, reason", [("raise", "RuntimeError"), ("nan", "non_finite_logits"), ("inject", "injected")]
)
def test_fast_decode_failure_switches_to_fallback_and_output_is_unchanged(tiny_model, behaviour, reason):
    expected = [o.outputs[0].token_ids for o in LLM(tiny_model, mode="fallback").generate(PROMPTS, GREEDY)]
    llm = LLM(tiny_model, async_scheduling=False)  # the synchronous step (async: test_async_decode.py)
    runner = llm.engine.runner
    fake = runner.fast_decode = FakeDecode(runner, "ok" if behaviour == "inject" else behaviour)
    failures: list[str] = []
    hook = runner.on_fastpath_failure
    runner.on_fastpath_failure = lambda r: (failures.append(r), hook(r))
    engine = llm.engine
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"r{i}", p, GREEDY)
    engine.step()  # the prefill step (not a pure decode)
    assert fake.calls == 0
    if behaviour == "inject":
        runner.inject_fastpath_failure("test")
    done = {}
    while engine.has_unfinished():
        done.update((o.request_id, o.outputs[0].token_ids) for o in engine.step() if o.finished)
    outs = [done[f"r{i}"] for i in range(len(PROMPTS))]
    assert outs == expected
    assert failures == [reason]
    assert runner.mode == "fallback" and llm.engine.config.mode == "fallback"
    assert llm.engine.counters.fastpath_failures[reason] == 1
    calls = fake.calls
    llm.generate(PROMPTS[:1], GREEDY)
    assert fake.calls == calls  # fallback is sticky: the fast decode is not tried again


@pytest.mark.parametrize("behaviour", ["ok", "nan"])
def test_greedy_decode_reads_tokens_and_finiteness_in_one_transfer(tiny_model, monkeypatch, behaviour):
    """On the fast decode path a plain-greedy step's tokens come back together with the
    non-finite check (one host synchronisation); a non-finite step still falls back and
    every request gets the portable path's tokens."""
    import inferd.engine.runner.model_runner as model_runner

    def greedy_anywhere(logits, seqs):  # the real check also demands CUDA logits
        return all(s.params.is_greedy and s.params.logprobs is None for s in seqs)

    monkeypatch.setattr(model_runner, "can_sample_greedy_on_device", greedy_anywhere)
    expected = [o.outputs[0].token_ids for o in LLM(tiny_model, mode="fallback").generate(PROMPTS, GREEDY)]
    llm = LLM(tiny_model, async_scheduling=False)
    runner = llm.engine.runner
    runner.fast_decode = FakeDecode(runner, behaviour)
    reads = []  # each step's greedy tokens as the runner handed them to the engine
    execute = runner.execute

    def recording(batch):
        output = execute(batch)
        reads.append(output.sampled_token_ids)
        return output

    runner.execute = recording
    transfers = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: (transfers.append(t.shape), tolist(t))[1])
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert got == expected
    if behaviour == "ok":
        assert runner.mode == "fast" and sum(r is not None for r in reads) == GREEDY.max_tokens - 1
        decode_reads = [shape for shape in transfers if shape == (len(PROMPTS) + 1,)]
        assert len(decode_reads) == GREEDY.max_tokens - 1  # tokens + flag, once per decode step
    else:
        assert runner.mode == "fallback" and all(r is None for r in reads)


def test_engine_takes_the_greedy_tokens_the_runner_output_carries(tiny_model):
    """The engine reads a step's tokens from the runner's output only: greedy tokens
    there are used as they are, not recomputed from the logits."""
    llm = LLM(tiny_model, async_scheduling=False)
    runner = llm.engine.runner
    execute = runner.execute

    def decoding_sevens(batch):
        output = execute(batch)
        if not is_pure_decode(batch):
            return output
        return RunnerOutput(output.logits, sampled_token_ids=[7] * len(batch))

    runner.execute = decoding_sevens
    for out in llm.generate(PROMPTS, GREEDY):
        assert out.outputs[0].token_ids[1:] == [7] * (GREEDY.max_tokens - 1)


def test_fast_decode_used_for_pure_decode_steps_only(tiny_model):
    llm = LLM(tiny_model, async_scheduling=False)
    runner = llm.engine.runner
    fake = runner.fast_decode = FakeDecode(runner, "ok")
    llm.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    assert fake.calls == 4  # the first token comes from the prefill step
    assert runner.mode == "fast"


# --- Triton kernels under the interpreter ---------------------------------------------


def _arena(num_pages, layers, bs, kv_heads, dim, dtype=torch.float32):
    """K/V as strided views of an all-layers page arena, like the engine's pool."""
    arena = torch.randn(num_pages, 2, layers, bs, kv_heads, dim, dtype=dtype)
    return arena, arena[:, 0, 1], arena[:, 1, 1]


@needs_triton
@pytest.mark.parametrize("splits", [1, 2, 8])
@pytest.mark.parametrize("window", [None, 20])
def test_decode_attention_matches_reference_across_block_and_split_boundaries(splits, window):
    from inferd.engine.fast_path.attention import paged_decode_attention

    gen = torch.Generator().manual_seed(splits * 100 + (window or 0))
    _, k_cache, v_cache = _arena(48, 2, 16, 2, 32)
    ctx = torch.tensor([1, 15, 16, 17, 65, 300, 0])  # 0: a padded CUDA-graph row
    tables = torch.stack([torch.randperm(48, generator=gen)[:20] for _ in ctx]).to(torch.int32)
    qkv = torch.randn(len(ctx), 12 * 32, generator=gen)
    q = qkv[:, : 8 * 32].view(len(ctx), 8, 32)  # a strided view, as in the fused QKV output
    out = paged_decode_attention(q, k_cache, v_cache, tables, ctx, 0.3, splits, window)
    ref = reference_attention(q, k_cache, v_cache, tables, ctx, 0.3, window)
    assert torch.isfinite(out).all()
    assert (out.double() - ref).norm() / ref.norm() < 1e-5
    assert out[-1].abs().max() == 0  # empty context: zeros, not NaN
    # block-table entries loaded a tile ahead (the sweep's --prefetch): the same attention
    prefetched = paged_decode_attention(q, k_cache, v_cache, tables, ctx, 0.3, splits, window, prefetch=True)
    assert (prefetched.double() - ref).norm() / ref.norm() < 1e-5


@needs_triton
@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("heads, kv_heads", [(8, 2), (12, 2), (4, 4)])  # GQA 4, GQA 6, no GQA
def test_chunk_rows_in_packs_match_reference(splits, heads, kv_heads):
    """Rows of prefill chunks in packs sharing one table (attention/chunk_rows.py): each
    row causal over its own context, across packs, splits and blocks; padding rows zero."""
    from inferd.engine.fast_path.attention import paged_chunk_attention, rows_per_pack

    rows = rows_per_pack(heads, kv_heads)
    assert rows == {4: 4, 6: 2, 1: 16}[heads // kv_heads]
    gen = torch.Generator().manual_seed(splits + heads)
    _, k_cache, v_cache = _arena(48, 2, 8, kv_heads, 32)
    seq_tables = [torch.randperm(48, generator=gen)[:40].to(torch.int32) for _ in range(2)]
    # sequence 0: 6 new tokens after 131 cached ones; sequence 1: a fresh prompt of 3
    chunks = [(131, 6), (0, 3)]
    ctx, tables = [], []
    for (start, n), table in zip(chunks, seq_tables):
        ctx += [start + i + 1 for i in range(n)] + [0] * (-n % rows)
        tables += [table] * (n + -n % rows)
    ctx += [0] * (-len(ctx) % rows)  # a graph's padding: whole packs of context 0
    tables += [torch.zeros(40, dtype=torch.int32)] * (len(ctx) - len(tables))
    ctx_t, tables_t = torch.tensor(ctx), torch.stack(tables)
    q = torch.randn(len(ctx), heads, 32, generator=gen)
    out = paged_chunk_attention(q, k_cache, v_cache, tables_t, ctx_t, 0.3, splits, rows)
    ref = reference_attention(q, k_cache, v_cache, tables_t, ctx_t, 0.3)
    assert (out.double() - ref).norm() / ref.norm() < 1e-5
    assert out[ctx_t == 0].abs().max() == 0
    # any row count: a last pack cut short gives its rows the outputs they have in a whole one
    cut = paged_chunk_attention(q[:-1], k_cache, v_cache, tables_t[:-1], ctx_t[:-1], 0.3, splits, rows)
    assert torch.equal(cut, out[:-1])
    with pytest.raises(ValueError, match="rows_per_pack"):
        paged_chunk_attention(q, k_cache, v_cache, tables_t, ctx_t, 0.3, splits, 3)
    # fewer keys per iteration (the sweep's --tiles): the same attention
    small_tiles = paged_chunk_attention(q, k_cache, v_cache, tables_t, ctx_t, 0.3, splits, rows, tile_tokens=16)
    assert (small_tiles.double() - ref).norm() / ref.norm() < 1e-5
    with pytest.raises(ValueError, match="tile_tokens"):
        paged_chunk_attention(q, k_cache, v_cache, tables_t, ctx_t, 0.3, splits, rows, tile_tokens=24)
    # block-table entries loaded a tile ahead (the sweep's --prefetch): the same attention
    prefetched = paged_chunk_attention(q, k_cache, v_cache, tables_t, ctx_t, 0.3, splits, rows, 4, 2, 16, prefetch=True)
    assert (prefetched.double() - ref).norm() / ref.norm() < 1e-5
    # the smallest merge rounds (one split each; the sweep's --merge-tiles): the same attention
    pack_queries = 1 << (rows * heads // kv_heads - 1).bit_length()
    one_split_rounds = paged_chunk_attention(
        q, k_cache, v_cache, tables_t, ctx_t, 0.3, splits, rows, merge_tile=pack_queries * 32
    )
    assert (one_split_rounds.double() - ref).norm() / ref.norm() < 1e-5
    with pytest.raises(ValueError, match="merge_tile"):
        paged_chunk_attention(q, k_cache, v_cache, tables_t, ctx_t, 0.3, splits, rows, merge_tile=pack_queries * 16)


@needs_triton
def test_fused_small_ops_match_torch_references():
    from inferd.engine.fast_path import fused_ops as ops

    gen = torch.Generator().manual_seed(1)
    x, res = torch.randn(3, 100, generator=gen), torch.randn(3, 100, generator=gen)
    w = torch.randn(100, generator=gen)
    r1, r2 = res.clone(), res.clone()
    out1, new1 = ops.add_rms_norm(x, r1, w, 1e-5)
    out2, new2 = ops.add_rms_norm_reference(x, r2, w, 1e-5)
    torch.testing.assert_close(out1, out2)
    torch.testing.assert_close(r1, r2)  # residual updated in place
    gate_up = torch.randn(3, 2 * 300, generator=gen)
    torch.testing.assert_close(ops.silu_and_mul(gate_up), ops.silu_and_mul_reference(gate_up))


@needs_triton
@pytest.mark.parametrize("heads, kv_heads", [(8, 2), (12, 4), (20, 4), (1, 1)])  # q heads in one, two, three parts
def test_fused_rope_and_cache_matches_torch_reference(heads, kv_heads):
    from inferd.engine.fast_path import fused_ops as ops

    gen = torch.Generator().manual_seed(heads)
    tokens, dim = 4, 32
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen)
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim :].view(tokens, kv_heads, dim)
    positions = torch.tensor([0, 5, 17, 4000])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    slots = torch.tensor([3, PAD_SLOT, 40, 7])
    arena1, kc1, vc1 = _arena(8, 3, 16, kv_heads, dim)
    arena2 = arena1.clone()
    kc2, vc2 = arena2[:, 0, 1], arena2[:, 1, 1]
    q1, q2 = q.clone(), q.clone()
    ops.rope_and_cache(q1, k, v, positions, inv_freq, kc1, vc1, slots)
    ops.rope_and_cache_reference(q2, k, v, positions, inv_freq, kc2, vc2, slots)
    torch.testing.assert_close(q1, q2)
    torch.testing.assert_close(arena1, arena2)  # only the slots' rows of layer 1 changed, in both
    untouched = arena1.clone()
    ops.rope_and_cache(q.clone(), k, v, positions, inv_freq, kc1, vc1, torch.full((4,), PAD_SLOT))
    assert torch.equal(arena1, untouched)  # padded rows write nothing


@needs_triton
@pytest.mark.slow
def test_fused_decode_step_matches_portable_path(tiny_model):
    """The whole fused decode step (eager, no graphs on CPU) inside the engine."""
    from inferd.engine.fast_path import hot_kv_layers
    from inferd.engine.fast_path.fast_decoder import FastDecoder

    expected = LLM(tiny_model, mode="fallback", block_size=8)
    llm = LLM(tiny_model, block_size=8)
    runner = llm.engine.runner
    decoder = FastDecoder(runner.model, hot_kv_layers(runner))
    graphs = DecodeGraphs(decoder, 8, 256, runner.device, pages=runner.pages, use_graphs=False)
    runner.fast_decode = graphs
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=3)
    got = llm.generate(PROMPTS, params)
    want = expected.generate(PROMPTS, params)
    assert graphs.num_eager == 4 and runner.mode == "fast"  # the prefill step ran as rows too
    assert graphs.num_expanded == 1
    for g, w in zip(got, want):
        assert_same_completion(g.outputs[0], w.outputs[0])


def _scheduled(llm, prompts, params=GREEDY):
    for i, p in enumerate(prompts):
        llm.engine.add_request(f"s{i}", p, params)
    return llm.engine.scheduler.schedule().scheduled


def test_expanded_rows_are_the_chunks_tokens_over_their_own_tables(tiny_model):
    """A prefill chunk of n tokens becomes n rows, row i at position start + i seeing
    start + i + 1 keys; only a completing chunk's last row samples."""
    llm = LLM(tiny_model, block_size=8, max_num_batched_tokens=16, enable_prefix_caching=False)
    batch = _scheduled(llm, [PROMPTS[1], PROMPTS[0]])  # 3 tokens, then 13 of the 17-token prompt
    assert [item.num_tokens for item in batch] == [3, 13]
    rows = DecodeInputs.expanded(batch, 8)
    assert len(rows.input_ids) == sum(item.num_tokens for item in batch)
    at = 0
    for item in batch:
        seq, n, start = item.seq, item.num_tokens, item.seq.num_computed_tokens
        assert rows.input_ids[at : at + n] == seq.token_ids[start : start + n]
        assert rows.positions[at : at + n] == list(range(start, start + n))
        assert rows.context_lens[at : at + n] == list(range(start + 1, start + n + 1))
        assert all(t == seq.block_table for t in rows.block_tables[at : at + n])
        assert rows.slots[at + n - 1] == seq.block_table[(start + n - 1) // 8] * 8 + (start + n - 1) % 8
        at += n
    assert batch[0].completes and not batch[1].completes
    assert rows.sample_rows == [2]  # the short prompt's last row; the chunk samples nothing
    assert rows.padded(32).sample_rows == [2]


def test_prefill_steps_take_the_graphs_only_when_small_and_not_scoring_prompts(tiny_model):
    llm = LLM(tiny_model, block_size=8)
    runner = llm.engine.runner
    graphs = DecodeGraphs(object(), 8, 256, runner.device, use_graphs=False, max_expanded_rows=20)
    assert graphs.can_run(_scheduled(llm, [PROMPTS[0]]))  # 17 rows
    assert not graphs.can_run(_scheduled(LLM(tiny_model, block_size=8), [PROMPTS[0], [3] * 4]))  # 21 rows
    scoring = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1)
    assert not graphs.can_run(_scheduled(LLM(tiny_model, block_size=8), [PROMPTS[1]], scoring))
    off = DecodeGraphs(object(), 8, 256, runner.device, use_graphs=False, max_expanded_rows=0)
    assert not off.can_run(_scheduled(LLM(tiny_model, block_size=8), [PROMPTS[2] * 2]))
    with pytest.raises(ValueError, match="max_expanded_rows"):
        DecodeGraphs(object(), 8, 256, runner.device, max_expanded_rows=-1)


def _portable_answers_and_a_fast_llm(model: str, prompts, max_num_batched_tokens: int, max_tokens: int):
    """Each prompt's greedy answer on the portable path (one at a time), a fast-path LLM of
    the same prefix-caching engine options, and the sampling params used."""
    config = dict(
        block_size=8, max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=True, async_scheduling=False
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=2)
    fallback = LLM(model, mode="fallback", **config)
    return [fallback.generate([p], params)[0] for p in prompts], LLM(model, **config), params


@needs_triton
@pytest.mark.slow
def test_cached_prefix_and_chunked_prefill_as_graph_rows_match_portable_path(tiny_model):
    """Prompts over a cached prefix, a prompt split into chunks (the middle ones sample
    nothing) and decode rows beside them, all through the graphs' rows (eager on CPU)."""
    from inferd.engine.fast_path import hot_kv_layers
    from inferd.engine.fast_path.fast_decoder import FastDecoder

    shared = list(range(5, 45))
    prompts = [shared + [50, 51, 52], shared + [60], list(range(100, 131)), [7, 8]]
    want, llm, params = _portable_answers_and_a_fast_llm(tiny_model, prompts, max_num_batched_tokens=16, max_tokens=4)
    runner = llm.engine.runner
    graphs = DecodeGraphs(FastDecoder(runner.model, hot_kv_layers(runner)), 8, 256, runner.device, use_graphs=False)
    runner.fast_decode = graphs
    got = [llm.generate([p], params)[0] for p in prompts[:2]] + llm.generate(prompts[2:], params)
    for g, w in zip(got, want):
        assert_same_completion(g.outputs[0], w.outputs[0])
    assert runner.mode == "fast" and llm.engine.block_manager.prefix.hits > 0
    assert graphs.num_expanded >= 5  # every prefill chunk: at most 16 rows a step
    assert graphs.rows_per_pack > 1 and 0 < graphs.num_packed < graphs.num_expanded  # mixed steps: no packs


def _chunk_step(*tokens: int) -> list:
    """Stand-in scheduled items: what pack_for and can_expand read of a step."""
    from types import SimpleNamespace

    params = SimpleNamespace(prompt_logprobs=None)
    return [SimpleNamespace(num_tokens=n, seq=SimpleNamespace(params=params)) for n in tokens]


def test_chunk_steps_take_large_packs_from_64_rows_when_the_graph_size_stays():
    from types import SimpleNamespace

    decoder = SimpleNamespace(chunk_rows_per_pack=lambda: 4, chunk_large_rows_per_pack=lambda: 16)
    graphs = DecodeGraphs(decoder, 8, 4096, torch.device("cpu"), use_graphs=False)
    assert graphs.pack_for(_chunk_step(32)) == 4  # 32 rows: small packs
    assert graphs.pack_for(_chunk_step(100)) == 16  # 104 rows in packs of 4, 112 in packs of 16: both 128
    assert graphs.pack_for(_chunk_step(40, 30)) == 16  # 72 / 80 rows: both 128
    assert graphs.pack_for(_chunk_step(*[4] * 16)) == 4  # 64 rows in packs of 4, 256 in packs of 16
    assert graphs.pack_for(_chunk_step(100, 1)) == 1  # a decode row beside the chunk: no packs
    assert graphs.expanded_rows(_chunk_step(100)) == 112
    # chunks alone up to the ladder's top in packs; rows reading their contexts alone up to 64
    assert graphs.can_expand(_chunk_step(250)) and not graphs.can_expand(_chunk_step(250, 8))
    assert graphs.can_expand(_chunk_step(62, 1)) and not graphs.can_expand(_chunk_step(64, 1))
    unpacked = DecodeGraphs(object(), 8, 4096, torch.device("cpu"), use_graphs=False)
    assert unpacked.pack_for(_chunk_step(100)) == 1 and not unpacked.can_expand(_chunk_step(100))
    with pytest.raises(ValueError, match="max_unpacked_rows"):
        DecodeGraphs(decoder, 8, 4096, torch.device("cpu"), max_unpacked_rows=-1)


@needs_triton
@pytest.mark.slow
def test_long_chunks_in_large_packs_match_portable_path(tiny_model):
    """Chunks of 70 new tokens after a cached prefix and a fresh 100-token prompt run as
    graph rows in packs of 16 (the tiny model's GQA 2 fills 32 queries), token for token
    the portable path's."""
    from inferd.engine.fast_path import hot_kv_layers
    from inferd.engine.fast_path.fast_decoder import FastDecoder

    shared = list(range(5, 45))
    prompts = [shared + [7], shared + list(range(200, 270)), list(range(300, 400))]
    want, llm, params = _portable_answers_and_a_fast_llm(tiny_model, prompts, max_num_batched_tokens=128, max_tokens=3)
    runner = llm.engine.runner
    decoder = FastDecoder(runner.model, hot_kv_layers(runner))
    packs: list[int] = []
    forward = decoder.forward

    def recording_forward(*args, rows_per_pack=1, **kwargs):
        packs.append(rows_per_pack)
        return forward(*args, rows_per_pack=rows_per_pack, **kwargs)

    decoder.forward = recording_forward  # type: ignore[method-assign]
    graphs = DecodeGraphs(decoder, 8, 512, runner.device, use_graphs=False)
    runner.fast_decode = graphs
    assert (graphs.rows_per_pack, graphs.large_rows_per_pack) == (8, 16)
    got = [llm.generate([p], params)[0] for p in prompts]
    for g, w in zip(got, want):
        assert_same_completion(g.outputs[0], w.outputs[0])
    assert runner.mode == "fast" and llm.engine.block_manager.prefix.hits > 0
    assert packs.count(16) == 2 == graphs.num_large_packed  # the 70-token chunk and the 100-token prompt


@needs_triton
def test_mixed_step_attention_matches_portable_path():
    """Decode rows, fresh prompts (causal), chunks after a cached prefix (bottom-right
    mask), two prompts of one shape (one grouped SDPA call), in one step."""
    from inferd.engine.fast_path.attention import triton_paged_attention
    from inferd.engine.model.attention import AttentionMetadata, paged_attention

    gen = torch.Generator().manual_seed(3)
    bs, kv_heads, heads, dim = 8, 2, 8, 16
    _, k_cache, v_cache = _arena(64, 2, bs, kv_heads, dim)
    query_lens = [1, 5, 1, 3, 5, 4]
    context_lens = [9, 5, 30, 20, 5, 4]  # rows 1, 4: one shape; row 3: 17 cached tokens first
    tables = torch.stack([torch.randperm(64, generator=gen)[:4] for _ in query_lens])
    starts = [sum(query_lens[:i]) for i in range(len(query_lens))]
    positions = [c - n + j for n, c in zip(query_lens, context_lens) for j in range(n)]
    meta = AttentionMetadata(
        query_start=starts,
        query_lens=query_lens,
        context_lens=torch.tensor(context_lens),
        block_tables=tables,
        slot_mapping=torch.zeros(sum(query_lens), dtype=torch.long),
        positions=torch.tensor(positions),
        max_query_len=max(query_lens),
        max_context_len=max(context_lens),
    )
    q = torch.randn(sum(query_lens), heads, dim, generator=gen)
    got = triton_paged_attention(q, k_cache, v_cache, meta, 0.25)
    want = paged_attention(q, k_cache, v_cache, meta, 0.25)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    again = triton_paged_attention(q * 2, k_cache, v_cache, meta, 0.25)  # the step's plan is reused per layer
    torch.testing.assert_close(again, paged_attention(q * 2, k_cache, v_cache, meta, 0.25), rtol=1e-5, atol=1e-5)


@needs_triton
@pytest.mark.parametrize("kv_heads", [1, 2, 8])
def test_prefill_step_of_equal_fresh_prompts_matches_portable_path(kv_heads):
    """A step of fresh prompts of one length is one causal group over every token row: flash
    attention's native GQA on the K/V as gathered (no repeated heads), output returned as is."""
    from inferd.engine.fast_path.attention import triton_paged_attention
    from inferd.engine.fast_path.attention.prefill import plan_step
    from inferd.engine.model.attention import AttentionMetadata, paged_attention

    gen = torch.Generator().manual_seed(kv_heads)
    bs, heads, dim, n = 8, 8, 16, 11
    _, k_cache, v_cache = _arena(32, 2, bs, kv_heads, dim)
    tables = torch.stack([torch.randperm(32, generator=gen)[:2] for _ in range(3)])
    meta = AttentionMetadata(
        query_start=[0, n, 2 * n],
        query_lens=[n] * 3,
        context_lens=torch.tensor([n] * 3),
        block_tables=tables,
        slot_mapping=torch.zeros(3 * n, dtype=torch.long),
        positions=torch.arange(n).repeat(3),
        max_query_len=n,
        max_context_len=n,
    )
    plan = plan_step(meta, bs, torch.device("cpu"))
    assert plan.decode_rows is None and len(plan.groups) == 1 and plan.groups[0].first_row == 0
    q = torch.randn(3 * n, heads, dim, generator=gen)
    got = triton_paged_attention(q, k_cache, v_cache, meta, 0.25)
    torch.testing.assert_close(got, paged_attention(q, k_cache, v_cache, meta, 0.25), rtol=1e-5, atol=1e-5)


@needs_triton
def test_eager_step_chooses_sdpa_backends_once_for_all_its_layers(tiny_model, monkeypatch):
    """Every SDPA call of an eager step (a fresh prompt, a chunk after a cached prefix) runs
    with cuDNN's attention off (attention/prefill.py, SDPA_BACKENDS), and the backends are
    chosen once per step: entering the choice costs host time, and an eager step is
    host-bound. The choice is undone after the step."""
    from inferd.engine.fast_path import fast_decoder
    from inferd.engine.fast_path.attention import SDPA_BACKENDS, prefill, triton_paged_attention
    from inferd.engine.fast_path.warmup import synthetic_metadata

    runner = LLM(tiny_model, block_size=8).engine.runner
    decoder = fast_decoder.FastDecoder(runner.model, runner.kv_layers)
    choices, calls = [], []
    choose = fast_decoder.sdpa_kernel
    monkeypatch.setattr(fast_decoder, "sdpa_kernel", lambda backends: (choices.append(backends), choose(backends))[1])
    sdpa = prefill.F.scaled_dot_product_attention
    backends = torch.backends.cuda
    monkeypatch.setattr(
        prefill.F,
        "scaled_dot_product_attention",
        lambda *a, **k: (calls.append((backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled())), sdpa(*a, **k))[1],
    )
    meta = synthetic_metadata(((5, 5), (3, 20)), 8, runner.device)
    decoder.forward_step(torch.zeros(8, dtype=torch.long), meta, triton_paged_attention)
    assert choices == [SDPA_BACKENDS]
    assert calls == [(False, True)] * (2 * len(runner.kv_layers))  # two prefill groups a layer
    assert backends.cudnn_sdp_enabled()


@needs_triton
def test_prefix_cached_and_chunked_prompts_through_fast_attention(tiny_model):
    """Engine level: chunked prefill, prefix-cache hits and mixed steps on the fast
    attention (no decode graphs on CPU) give the portable path's tokens."""
    from inferd.engine.fast_path.attention import triton_paged_attention

    shared = list(range(5, 45))
    prompts = [shared + [50, 51, 52], shared + [60], list(range(100, 131)), [7, 8]]
    config = dict(block_size=8, max_num_batched_tokens=32, enable_prefix_caching=True)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2)
    want = LLM(tiny_model, mode="fallback", **config).generate(prompts, params)
    llm = LLM(tiny_model, **config)
    llm.engine.runner.fast_attention = triton_paged_attention
    got = llm.generate(prompts, params)
    for g, w in zip(got, want):
        assert_same_completion(g.outputs[0], w.outputs[0])
    assert llm.engine.runner.mode == "fast" and llm.engine.block_manager.prefix.hits > 0


def test_benchmark_cost_model_counts_the_8b_shape_by_hand():
    from inferd.engine.bench.gpu_decode import ModelCost, roofline_seconds
    from inferd.engine.model.make_model import PRESETS
    from inferd.engine.model.model_config import ModelConfig

    cfg = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], **PRESETS["llama3-8b-shape"]})
    cost = ModelCost(cfg)
    # per layer q+k+v+o 41,943,040 + MLP 176,160,768; x32; + LM head 525,336,576
    assert cost.matmul_params == 7_504_658_432
    assert cost.weight_bytes_read == (7_504_658_432 + 65 * 4096) * 2  # + 65 norm vectors
    assert cost.kv_bytes_per_token == 131_072
    nbytes, flops = cost.step([(1, 640)])
    assert nbytes == cost.weight_bytes_read + 641 * 131_072
    assert flops == 2 * 7_504_658_432 + 4 * 32 * 128 * 32 * 640
    _, prefill_flops = cost.step([(2, 3)])  # two queries at positions 1 and 2: 2 + 3 keys
    assert prefill_flops == 2 * 2 * 7_504_658_432 + 4 * 32 * 128 * 32 * 5
    assert roofline_seconds(cost, [[(1, 640)]], bandwidth=nbytes, flops_rate=flops * 10) == 1.0


def test_gpu_decode_bench_refuses_cleanly_without_cuda(tmp_path, capsys):
    import argparse

    from inferd.engine.bench import gpu_decode

    parser = argparse.ArgumentParser()
    gpu_decode.add_arguments(parser)
    assert gpu_decode.run(parser.parse_args(["--out", str(tmp_path)])) == 2
    assert "CUDA" in capsys.readouterr().out
    assert gpu_decode.run(parser.parse_args(["--out", str(tmp_path), "--repeats", "0"])) == 2
    assert "--repeats must be at least 1, got 0" in capsys.readouterr().out


@pytest.mark.parametrize(
    "tok_s, median",
    [([5.0], 5.0), ([3.0, 9.0, 4.0], 4.0), ([8.0, 2.0, 6.0, 4.0], 4.0)],
)
def test_benchmark_keeps_the_median_run_and_every_runs_rate(tok_s, median):
    from inferd.engine.bench.gpu_decode import median_run

    runs = [{"tok_s": t, "seconds": 1 / t} for t in tok_s]
    kept = median_run(runs)
    assert kept["tok_s"] == median and kept["seconds"] == 1 / median  # one run's figures, not a mix
    assert kept["tok_s_runs"] == tok_s
    with pytest.raises(ValueError, match="at least one run"):
        median_run([])


# --- cold (quantized) KV blocks in the Triton decode kernel --------------------------
def _cold_case(gen, hd, ctx, num_pages, first_cold_page, kind_of, bs=8, kv_heads=2, window=8):
    """A one-layer KV cache holding sequences of `ctx` tokens of random K/V, whose blocks
    older than `window` are quantized, block j of sequence i to kind_of(i, j), into slots
    from first_cold_page[kind] on. Returns (k, v, cold, decode metadata, padded
    (tables, kinds, slots))."""
    from inferd.engine.kv.block_pool import KIND_CODE
    from inferd.engine.kv.kv_cache import KVCache
    from inferd.engine.model.attention import AttentionMetadata, write_kv

    cache = KVCache(1, num_pages, 0, bs, kv_heads, hd, torch.float32, torch.device("cpu"), None, tuple(first_cold_page))
    k, v, cold = cache.layer_views(0)
    per_page = cache.shape.slots_per_page()
    tables, kinds, slots, hot_tables, pairs = [], [], [], [], []
    next_page, used = 0, dict.fromkeys(first_cold_page, 0)
    for i, n in enumerate(ctx):
        row, kind_row, slot_row, hot_row = [], [], [], []
        for j in range(-(-n // bs)):
            hot_row.append(next_page)
            row.append(next_page), kind_row.append(0), slot_row.append(0)
            if (j + 1) * bs <= n - window:
                kind = kind_of(i, j)
                page, slot = first_cold_page[kind] + used[kind] // per_page[kind], used[kind] % per_page[kind]
                used[kind] += 1
                pairs.append((next_page, (kind, page, slot)))
                row[-1], kind_row[-1], slot_row[-1] = page, KIND_CODE[kind], slot
            next_page += 1
        tables.append(row), kinds.append(kind_row), slots.append(slot_row), hot_tables.append(hot_row)
    token_slots = torch.tensor([hot_tables[i][t // bs] * bs + t % bs for i, n in enumerate(ctx) for t in range(n)])
    write_kv(
        k,
        v,
        torch.randn(len(token_slots), kv_heads, hd, generator=gen),
        torch.randn(len(token_slots), kv_heads, hd, generator=gen),
        token_slots,
    )
    cache.quantize(pairs)
    assert all(used.values())  # every kind asked for was used
    width = max(map(len, tables))
    padded = [torch.tensor([r + [0] * (width - len(r)) for r in rows]) for rows in (tables, kinds, slots)]
    meta = AttentionMetadata(
        query_start=list(range(len(ctx))),
        query_lens=[1] * len(ctx),
        context_lens=torch.tensor(ctx),
        block_tables=padded[0],
        slot_mapping=torch.zeros(0, dtype=torch.long),
        positions=torch.tensor([max(n - 1, 0) for n in ctx]),
        max_query_len=1,
        max_context_len=max(ctx),
        block_kinds=padded[1],
        block_slots=padded[2],
    )
    return k, v, cold, meta, padded


@needs_triton
@pytest.mark.parametrize("splits, hd", [(1, 32), (4, 32), (2, 256)])  # 256: two int4 scale groups per head
def test_cold_decode_kernel_matches_portable_cold_attention(splits, hd):
    """Hot, int8 and int4 blocks mixed within sequences: the Triton kernel (one pass,
    dequantizing in registers) equals the portable path's dequantize-then-attend."""
    from inferd.engine.fast_path.attention import cold_paged_decode_attention, triton_paged_attention
    from inferd.engine.model.attention import paged_attention

    gen = torch.Generator().manual_seed(splits)
    ctx = [1, 9, 17, 40, 70]
    k, v, cold, meta, (tables, kinds, slots) = _cold_case(
        gen,
        hd,
        ctx,
        num_pages=64,
        first_cold_page={"int8": 40, "int4": 52},
        kind_of=lambda i, j: ("int8", "int4")[(i + j) % 2],
    )
    heads = 4
    q = torch.randn(len(ctx), heads, hd, generator=gen)
    ref = paged_attention(q, k, v, meta, 0.3, cold=cold)
    out = cold_paged_decode_attention(q, k, v, cold, tables.int(), kinds, slots, torch.tensor(ctx), 0.3, splits)
    assert torch.isfinite(out).all()
    assert (out - ref).norm() / ref.norm() < 1e-5
    routed = triton_paged_attention(q, k, v, meta, 0.3, cold=cold)
    assert (routed - ref).norm() / ref.norm() < 1e-5


def test_cold_prefix_layout_accepts_leading_runs_of_one_kind_only():
    import numpy as np

    from inferd.engine.fast_path.cold_layout import cold_prefix_layout

    counts, kind = cold_prefix_layout(np.array([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]))
    assert counts.tolist() == [2, 1, 0] and kind == 1
    counts, kind = cold_prefix_layout(np.zeros((2, 3), dtype=np.int64))
    assert counts.tolist() == [0, 0] and kind == 0
    assert cold_prefix_layout(np.array([[0, 1, 0]])) is None  # a hot block before a cold one
    assert cold_prefix_layout(np.array([[1, 1, 0], [2, 0, 0]])) is None  # two cold kinds in one batch
    assert cold_prefix_layout(np.array([[1, 2, 0]])) is None
    with pytest.raises(ValueError, match="kinds must be"):
        cold_prefix_layout(np.zeros(3))


@needs_triton
@pytest.mark.parametrize(
    "kind, splits, hd, dtype",
    [
        ("int8", 1, 32, torch.float32),
        ("int8", 4, 32, torch.float32),
        ("int4", 2, 32, torch.float32),
        ("int4", 2, 256, torch.float32),
        ("int8", 4, 32, torch.float16),
        ("int4", 2, 32, torch.float16),
        ("int4", 2, 256, torch.float16),
    ],
)
def test_cold_prefix_kernel_matches_portable_cold_attention(kind, splits, hd, dtype):
    """Cold blocks leading each table, hot ones after (the engine's usual layout): the
    two-run kernel equals the portable dequantize-then-attend path, for contexts that
    cross block, tile, split and hot/cold boundaries and a padded row. float32 queries
    take the exact loop; fp16 ones the GPU's fast loop (int8 keys against int8 queries,
    fp16 codes), except int4 with two scale groups per head (256), which stays exact."""
    import numpy as np

    from inferd.engine.fast_path.attention import cold_prefix_decode_attention, triton_paged_attention
    from inferd.engine.fast_path.cold_layout import cold_prefix_layout
    from inferd.engine.kv.block_pool import KIND_CODE
    from inferd.engine.model.attention import paged_attention

    gen = torch.Generator().manual_seed(splits + hd)
    ctx = [1, 9, 17, 40, 70, 150, 0]
    k, v, cold, meta, (tables, kinds, slots) = _cold_case(
        gen, hd, ctx, num_pages=96, first_cold_page={kind: 80}, kind_of=lambda i, j: kind
    )
    heads = 4
    counts, code = cold_prefix_layout(kinds.numpy())
    assert code == KIND_CODE[kind] and counts.max() > 0
    q = torch.randn(len(ctx), heads, hd, generator=gen)
    ref = paged_attention(q, k, v, meta, 0.3, cold=cold)
    out = cold_prefix_decode_attention(
        q.to(dtype),
        k.to(dtype),
        v.to(dtype),
        cold,
        tables.int(),
        slots.int(),
        torch.from_numpy(np.ascontiguousarray(counts)),
        code,
        torch.tensor(ctx),
        0.3,
        splits,
    )
    assert out.dtype == dtype and torch.isfinite(out).all() and out[-1].abs().max() == 0  # the padded row is zeros
    # Exact codes in every case; fp16 adds its rounding, int8 queries theirs (about 3e-3 here).
    tol = 1e-5 if dtype == torch.float32 else (1.5e-2 if kind == "int8" else 2e-3)
    assert (out.float() - ref).norm() / ref.norm() < tol
    if dtype != torch.float32:
        return
    meta.cold_prefix_blocks, meta.cold_prefix_kind = torch.from_numpy(counts), code
    routed = triton_paged_attention(q, k, v, meta, 0.3, cold=cold)
    assert (routed - ref).norm() / ref.norm() < 1e-5


@needs_triton
@pytest.mark.parametrize("tile", [16, 48])
def test_cold_prefix_kernel_refuses_tiles_it_is_not_validated_for(tile):
    from inferd.engine.fast_path.attention import cold_prefix_decode_attention

    gen = torch.Generator().manual_seed(0)
    k, v, cold, meta, (tables, kinds, slots) = _cold_case(
        gen, 32, [40], num_pages=16, first_cold_page={"int4": 12}, kind_of=lambda i, j: "int4"
    )
    q = torch.randn(1, 4, 32, generator=gen)
    with pytest.raises(ValueError, match=f"tile must be a power of two of at least 32, got {tile}"):
        cold_prefix_decode_attention(
            q, k, v, cold, tables.int(), slots.int(), torch.tensor([2]), 2, torch.tensor([40]), 0.3, 1, tile=tile
        )


@needs_triton
@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cold_prefix_kernel_reads_tables_and_scales_ahead_of_their_tiles(kind, dtype):
    """Table entries (and, in the fast loop, the scales) are read two tiles ahead of
    their tile: for cold runs of 1 to 9 tiles per split whose blocks sit in slots out of
    order, so an entry or a scale used for the wrong tile would show, the output equals
    the portable path's."""
    from inferd.engine.fast_path.attention import cold_prefix_decode_attention
    from inferd.engine.kv.block_pool import KIND_CODE
    from inferd.engine.model.attention import paged_attention

    gen = torch.Generator().manual_seed(7)
    ctx = [40, 100, 300, 0]
    k, v, cold, meta, (tables, kinds, slots) = _cold_case(
        gen, 32, ctx, num_pages=160, first_cold_page={kind: 60}, kind_of=lambda i, j: kind
    )
    cold_rows = kinds != 0
    order = torch.randperm(int(cold_rows.sum()), generator=gen)  # shuffle the cold blocks' (page, slot) pairs
    tables[cold_rows], slots[cold_rows] = tables[cold_rows][order], slots[cold_rows][order]
    meta.block_tables = tables
    meta.block_slots = slots
    q = torch.randn(len(ctx), 4, 32, generator=gen)
    ref = paged_attention(q, k, v, meta, 0.3, cold=cold)
    tol = 1e-5 if dtype == torch.float32 else 1.5e-2
    for splits in (1, 2):
        out = cold_prefix_decode_attention(
            q.to(dtype),
            k.to(dtype),
            v.to(dtype),
            cold,
            tables.int(),
            slots.int(),
            cold_rows.sum(1),
            KIND_CODE[kind],
            torch.tensor(ctx),
            0.3,
            splits,
            tile=32,
        )
        assert (out.float() - ref).norm() / ref.norm() < tol


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_fused_decode_step_with_cold_kv_matches_portable_path(tiny_model, kind):
    """The fused decode step over cold-then-hot tables (the graphs' cold variant, run
    eagerly on CPU) and the fast path's chunked prefill and mixed steps over cold blocks
    (grouped SDPA over dequantized gathers, the cold decode kernel for decode rows)
    inside the engine equal the portable cold attention."""
    from inferd.engine.fast_path.attention import triton_paged_attention
    from inferd.engine.fast_path.cuda_graphs import DecodeGraphs
    from inferd.engine.fast_path.fast_decoder import FastDecoder

    config = dict(block_size=8, kv_cold_dtype=kind, kv_hot_window=16, max_num_batched_tokens=24)
    expected = LLM(tiny_model, **config)  # no Triton on CPU: the portable attention, cooling as usual
    llm = LLM(tiny_model, **config)
    runner = llm.engine.runner
    decoder = FastDecoder(runner.model, runner.kv_layers)
    kinds_seen = []
    forward = decoder.forward
    decoder.forward = lambda *a, **kw: (kinds_seen.append(kw["cold_kind"]), forward(*a, **kw))[1]
    runner.fast_decode = DecodeGraphs(decoder, 8, 256, runner.device, pages=runner.pages, use_graphs=False)
    runner.fast_attention = triton_paged_attention
    prompts = [list(range(3, 3 + n)) for n in (41, 57, 9)]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=3)
    got = llm.generate(prompts, params)
    want = expected.generate(prompts, params)
    assert runner.mode == "fast" and KIND_CODES[kind] in kinds_seen
    assert llm.engine.kv_snapshot().blocks_by_dtype[kind] == 0  # all freed at the end
    for g, w in zip(got, want):
        assert_same_completion(g.outputs[0], w.outputs[0])


KIND_CODES = {"int8": 1, "int4": 2}


@needs_triton
@pytest.mark.slow
def test_mixed_cold_kinds_leave_the_graphs_for_the_per_tile_kernel(tiny_model):
    """After a run-time switch from int8 to int4 a sequence holds both kinds: the decode
    graphs decline the batch (None) and the step runs eagerly through the per-tile cold
    kernel; tokens and log-probabilities equal the portable path's with the same switch."""
    from inferd.engine.fast_path.attention import triton_paged_attention
    from inferd.engine.fast_path.cuda_graphs import DecodeGraphs
    from inferd.engine.fast_path.fast_decoder import FastDecoder

    def run(llm, fast: bool):
        engine, declined = llm.engine, []
        runner = engine.runner
        if fast:
            graphs = DecodeGraphs(
                FastDecoder(runner.model, runner.kv_layers), 8, 256, runner.device, pages=runner.pages, use_graphs=False
            )
            execute = graphs.execute
            graphs.execute = lambda batch: (lambda out: (declined.append(out is None), out)[1])(execute(batch))
            runner.fast_decode, runner.fast_attention = graphs, triton_paged_attention
        params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=2)
        engine.add_request("a", list(range(5, 45)), params)
        engine.add_request("b", list(range(50, 75)), params)
        outs, step = {}, 0
        while engine.has_unfinished():
            if step == 3:
                engine.reconfigure({"kv_cold_dtype": "int4"})
            for o in engine.step():
                outs[o.request_id] = o.outputs[0]
            step += 1
        return outs, declined

    config = dict(block_size=8, kv_cold_dtype="int8", kv_hot_window=8)
    want, _ = run(LLM(tiny_model, **config), fast=False)
    llm = LLM(tiny_model, **config)
    got, declined = run(llm, fast=True)
    assert any(declined) and not all(declined)  # graphs took the one-kind steps, declined the mixed ones
    assert llm.engine.runner.mode == "fast"
    for rid in want:
        assert_same_completion(got[rid], want[rid])


@pytest.mark.parametrize("behaviour", ["ok", "nan"])
def test_sampled_decode_reads_the_non_finite_check_with_its_tokens(tiny_model, monkeypatch, behaviour):
    """Synchronous non-greedy steps on the fast decode path: the finiteness flag rides on
    the sampler's token read; a non-finite step switches to fallback and runs again, and a
    seeded row's noise depends on its seed and output position only, so seeded outputs
    equal the portable path's."""
    params = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=6, seed=7, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in LLM(tiny_model, mode="fallback").generate(PROMPTS, params)]
    llm = LLM(tiny_model, async_scheduling=False)
    runner = llm.engine.runner
    runner.fast_decode = FakeDecode(runner, behaviour)
    transfers = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: (transfers.append(t.shape), tolist(t))[1])
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    assert got == expected
    assert runner.mode == ("fast" if behaviour == "ok" else "fallback")
    with_flag = [shape for shape in transfers if shape == (len(PROMPTS) + 1,)]
    assert len(with_flag) == (params.max_tokens - 1 if behaviour == "ok" else 1)
    if behaviour == "nan":
        assert llm.engine.counters.fastpath_failures["non_finite_logits"] == 1


@pytest.mark.parametrize(
    "budget, max_model_len, pieces",
    [
        (8192, 40960, [(512, 512)] * 16),
        (1000, 0, [(512, 512), (488, 488)]),
        (40, 16, [(16, 16), (16, 16), (8, 8)]),
        (0, 4096, []),
    ],
)
def test_budget_step_fills_the_step_budget_with_fresh_prompts(budget, max_model_len, pieces):
    from inferd.engine.fast_path.warmup import budget_step

    assert list(budget_step(budget, max_model_len)) == pieces


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize("cold", ["none", "int8"])
def test_prefill_warmup_runs_the_fused_step_and_writes_no_kv(tiny_model, cold, monkeypatch):
    """The start-up warm-up of the prefill path (fast_path/warmup.py) runs the fused step
    over its synthetic mixed batches (fresh prompt, chunk after a prefix, decode row; a
    lone longer prompt), then one step filling the step budget, each with its logits
    tail, and leaves the KV pool exactly as it was: every slot
    is the padding slot."""
    from inferd.engine.fast_path.attention import triton_paged_attention
    from inferd.engine.fast_path.fast_decoder import FastDecoder
    from inferd.engine.fast_path.warmup import WARMUP_STEPS, warm_prefill_kernels

    llm = LLM(tiny_model, block_size=8, kv_cold_dtype=cold)
    runner = llm.engine.runner
    assert (runner.kv_layers[0][2] is not None) == (cold != "none")
    for k, v, _ in runner.kv_layers:
        k.normal_(), v.normal_()
    before = [(k.clone(), v.clone()) for k, v, _ in runner.kv_layers]
    decoder = FastDecoder(runner.model, runner.kv_layers)
    calls = []
    forward_step = decoder.forward_step
    decoder.forward_step = lambda ids, meta, fn: (
        calls.append((ids.shape[0], meta.query_lens)),
        forward_step(ids, meta, fn),
    )[1]
    import inferd.engine.fast_path.attention as cold_module

    cold_splits = []
    cold_kernel = cold_module.cold_paged_decode_attention
    monkeypatch.setattr(
        cold_module, "cold_paged_decode_attention", lambda *a: (cold_splits.append(a[-1]), cold_kernel(*a))[1]
    )
    logit_rows = []
    compute_logits = decoder.model.compute_logits
    monkeypatch.setattr(
        decoder.model, "compute_logits", lambda h: (logit_rows.append(h.shape[0]), compute_logits(h))[1]
    )
    warm_prefill_kernels(decoder, triton_paged_attention, 8, runner.device, max_step_tokens=40, max_model_len=16)
    assert [c[1] for c in calls] == [[n for n, _ in step] for step in WARMUP_STEPS] + [[16, 16, 8]]
    assert logit_rows == [2] * len(calls)  # every step's logits tail, as the runner and the sampler run it
    assert cold_splits == ([1, 2, 4, 8, 16, 32, 64] if cold != "none" else [])  # every split count
    assert {c[0] % 16 == 0 for c in calls} == {True, False}  # both specialisations of the token count
    for (k, v, _), (k0, v0) in zip(runner.kv_layers, before):
        assert torch.equal(k, k0) and torch.equal(v, v0)
