"""The fast path on every model shape users load, and fallback for faults only.

Under Triton's CPU interpreter (float32): the decode kernel, the chunk-row kernel and the
fused RoPE/cache write across GQA groups 1-8 (non-powers of two too), head dims 64, 80,
96 and 128, and any number of rows; then whole engines on tiny models of those traits
(multi-head, GQA 3/5/6/7/8, head dims 80 and 96, q/k/v bias, tied embeddings) running a
lone short chunk after a cached prefix, eight prompts of mixed lengths after it and a
chunked prompt, through the decode graphs' rows (eager on the CPU) and the fast
attention: token for token the portable path's, never leaving the fast path. These run
strict (conftest.strict_fast_path): an exception in our launch code fails the test.

Without Triton: how the runner tells a fault (switch to fallback) from a bug in its own
launch code (that step runs portable, counted, the mode stays).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from inferd.engine import LLM, SamplingParams
from inferd.engine.fast_path import has_triton
from inferd.engine.fast_path.cuda_graphs import DecodeGraphs, is_pure_decode
from inferd.engine.fast_path.greedy_head import greedy_with_flag_reference
from inferd.engine.fast_path.launch_shape import next_power_of_2
from inferd.engine.runner.fastpath_faults import is_launch_bug
from inferd.engine.runner.model_runner import FastPathError

from attention_reference import reference_attention

needs_triton = pytest.mark.skipif(
    not has_triton() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton (pip) with TRITON_INTERPRET=1 for its CPU interpreter",
)
GROUPS = (1, 2, 3, 4, 5, 6, 7, 8)
HEAD_DIMS = (64, 80, 96, 128)


def _core(group: int, head_dim: int) -> bool:
    """The cases that run in the quick suite; the rest of the matrix is marked slow."""
    return (group, head_dim) in {(1, 80), (3, 96), (7, 64), (8, 128)}


def _matrix():
    return [
        pytest.param(g, d, marks=() if _core(g, d) else pytest.mark.slow, id=f"gqa{g}-d{d}")
        for g in GROUPS
        for d in HEAD_DIMS
    ]


def _caches(gen, num_pages, bs, kv_heads, dim):
    """K and V as strided views of a two-layer page arena, like the engine's pool."""
    arena = torch.randn(num_pages, 2, 2, bs, kv_heads, dim, generator=gen)
    return arena[:, 0, 1], arena[:, 1, 1]


def _relative_error(out, ref) -> float:
    return float((out.double() - ref).norm() / ref.norm())


# --- kernels under the interpreter ------------------------------------------------------
@needs_triton
@pytest.mark.parametrize("group, head_dim", _matrix())
def test_decode_kernel_takes_every_group_and_head_dim(group, head_dim):
    """Decode rows (hot.py) of an odd batch with a padded row, across splits: the float64 reference."""
    from inferd.engine.fast_path.attention import paged_decode_attention

    gen = torch.Generator().manual_seed(group * 1000 + head_dim)
    kv_heads = 2 if group < 4 else 1
    k_cache, v_cache = _caches(gen, 24, 8, kv_heads, head_dim)
    ctx = torch.tensor([1, 17, 70, 0, 9])  # 0: a padded graph row
    tables = torch.stack([torch.randperm(24, generator=gen)[:12] for _ in ctx]).to(torch.int32)
    q = torch.randn(len(ctx), group * kv_heads, head_dim, generator=gen)
    ref = reference_attention(q, k_cache, v_cache, tables, ctx, head_dim**-0.5)
    for splits in (1, 2):
        out = paged_decode_attention(q, k_cache, v_cache, tables, ctx, head_dim**-0.5, splits)
        assert _relative_error(out, ref) < 1e-5
        assert out[3].abs().max() == 0


def _chunk_rows(chunks, rows_per_pack: int, size: int, seq_tables):
    """(context lengths, tables) of a chunk step laid out as the decode graphs do
    (cuda_graphs.DecodeInputs.expanded): each chunk's rows start a pack, then padding rows
    up to `size`, which need not be a whole number of packs."""
    ctx: list[int] = []
    tables: list[torch.Tensor] = []
    for (start, n), table in zip(chunks, seq_tables):
        pad = -len(ctx) % rows_per_pack
        ctx += [0] * pad + [start + i + 1 for i in range(n)]
        tables += [seq_tables[0]] * pad + [table] * n
    assert len(ctx) <= size
    ctx += [0] * (size - len(ctx))
    tables += [torch.zeros_like(seq_tables[0])] * (size - len(tables))
    return torch.tensor(ctx), torch.stack(tables)


@needs_triton
@pytest.mark.parametrize("group, head_dim", _matrix())
def test_chunk_rows_take_any_row_count_at_every_group_and_head_dim(group, head_dim):
    """Chunk rows in the engine's small and large packs (chunk_rows.py) at row counts that
    are not whole packs: a lone chunk shorter than a pack on the smallest graph holding
    it (the multi-head model's 6 new tokens on a graph of 8 rows in packs of 16), and
    chunks after a cached prefix on graphs of odd sizes."""
    from inferd.engine.fast_path.attention import large_pack_queries, paged_chunk_attention, rows_per_pack

    gen = torch.Generator().manual_seed(group * 100 + head_dim)
    kv_heads = 2 if group < 4 else 1
    heads = group * kv_heads
    k_cache, v_cache = _caches(gen, 24, 8, kv_heads, head_dim)
    seq_tables = [torch.randperm(24, generator=gen)[:12].to(torch.int32) for _ in range(3)]
    small = rows_per_pack(heads, kv_heads)
    large = rows_per_pack(heads, kv_heads, large_pack_queries(head_dim))
    cases = [
        (small, [(40, 6)], 8 if small > 4 else small + 1),  # a lone short chunk
        (small, [(40, 3), (0, 5), (70, 2)], 2 * small + 3),
        (large, [(20, 9), (0, 4)], large + 5),
    ]
    for rows, chunks, size in cases:
        size = max(size, sum(-(-n // rows) * rows for _, n in chunks[:-1]) + chunks[-1][1])
        ctx, tables = _chunk_rows(chunks, rows, size, seq_tables)
        q = torch.randn(len(ctx), heads, head_dim, generator=gen)
        out = paged_chunk_attention(q, k_cache, v_cache, tables, ctx, head_dim**-0.5, 2, rows)
        ref = reference_attention(q, k_cache, v_cache, tables, ctx, head_dim**-0.5)
        assert out.shape == q.shape
        assert _relative_error(out, ref) < 1e-5, (rows, chunks, size)
        assert not out[ctx == 0].any()


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 160, 256])
@pytest.mark.parametrize("group", GROUPS)
def test_engine_packs_fit_a_merge_round_at_every_group_and_head_dim(group, head_dim):
    """The packs the engine chooses (FastDecoder.chunk_*_rows_per_pack) pass the chunk
    kernel's merge-round check: a pack's queries and head dim, each padded to a power of
    two, fit MERGE_TILE_ELEMENTS (at head dim 160, 16 rows of GQA 3 did not)."""
    from inferd.engine.fast_path.attention import MERGE_TILE_ELEMENTS, large_pack_queries, rows_per_pack

    for queries in (16, large_pack_queries(head_dim)):
        rows = rows_per_pack(group, 1, queries)
        assert next_power_of_2(rows * group) * next_power_of_2(head_dim) <= MERGE_TILE_ELEMENTS


@needs_triton
@pytest.mark.parametrize("head_dim", [80, 96])
def test_rope_and_cache_takes_head_dims_that_are_not_powers_of_two(head_dim):
    from inferd.engine.fast_path import fused_ops as ops

    gen = torch.Generator().manual_seed(head_dim)
    tokens, heads, kv_heads = 3, 6, 2
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim :].view(tokens, kv_heads, head_dim)
    positions = torch.tensor([0, 9, 300])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    slots = torch.tensor([3, -1, 12])
    arena = torch.randn(4, 2, 2, 8, kv_heads, head_dim, generator=gen)
    expected_arena = arena.clone()
    q1, q2 = q.clone(), q.clone()
    ops.rope_and_cache(q1, k, v, positions, inv_freq, arena[:, 0, 1], arena[:, 1, 1], slots)
    ops.rope_and_cache_reference(q2, k, v, positions, inv_freq, expected_arena[:, 0, 1], expected_arena[:, 1, 1], slots)
    torch.testing.assert_close(q1, q2)
    torch.testing.assert_close(arena, expected_arena)  # nothing written past a head's last lane


# --- whole engines on tiny models of each trait ------------------------------------------
# ModelSpec fields over the tiny preset (hidden 64, 4 heads over 2, 2 layers): each shape
# is a trait of a family users load. The head dim is hidden_size // num_attention_heads.
SHAPES = {
    "mha": dict(overrides=dict(num_attention_heads=4, num_key_value_heads=4)),
    "gqa3-bias-tied": dict(
        arch="qwen2", tie_word_embeddings=True, overrides=dict(hidden_size=96, num_attention_heads=6)
    ),
    "gqa5": dict(overrides=dict(hidden_size=80, num_attention_heads=5, num_key_value_heads=1)),
    "gqa6-bias": dict(arch="qwen2", overrides=dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=1)),
    "gqa7-tied": dict(
        tie_word_embeddings=True, overrides=dict(hidden_size=112, num_attention_heads=7, num_key_value_heads=1)
    ),
    "gqa8": dict(overrides=dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=1)),
    "mha-head-dim-80": dict(overrides=dict(hidden_size=160, num_attention_heads=2, num_key_value_heads=2)),
    "gqa2-head-dim-96": dict(overrides=dict(hidden_size=192, num_attention_heads=2, num_key_value_heads=1)),
}
SHARED = list(range(5, 37))  # four full blocks of 8: cached after the first request
SUFFIXES = (1, 2, 3, 5, 6, 7, 9, 12)  # eight prompts of mixed lengths after the prefix
ENGINE = dict(block_size=8, max_num_batched_tokens=16, enable_prefix_caching=True, async_scheduling=False)
PARAMS = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, logprobs=2)


def _requests() -> list[list[list[int]]]:
    """The engine runs each group of prompts in one generate call, in order: the prefix
    fill, a lone 6-token chunk after the cached prefix, eight mixed-length prompts after
    it at once, and a fresh 40-token prompt in chunks of 16 beside a short one."""
    mixed = [SHARED + list(range(100 + 20 * i, 100 + 20 * i + n)) for i, n in enumerate(SUFFIXES)]
    return [[SHARED + [60]], [SHARED + list(range(70, 76))], mixed, [list(range(300, 340)), [7, 8, 9]]]


def _fast_llm(model: str) -> LLM:
    """An engine with the fast attention and the decode graphs' fused step (eager on the CPU)."""
    from inferd.engine.fast_path import hot_kv_layers
    from inferd.engine.fast_path.attention import triton_paged_attention
    from inferd.engine.fast_path.fast_decoder import FastDecoder

    llm = LLM(model, **ENGINE)
    runner = llm.engine.runner
    runner.fast_attention = triton_paged_attention
    decoder = FastDecoder(runner.model, hot_kv_layers(runner))
    runner.fast_decode = DecodeGraphs(decoder, 8, 256, runner.device, pages=runner.pages, use_graphs=False)
    return llm


def _assert_same_completion(got, want, tol: float = 1e-4) -> None:
    assert got.token_ids == want.token_ids
    for lp_g, lp_w in zip(got.logprobs, want.logprobs):
        assert lp_g.keys() == lp_w.keys()
        assert all(abs(lp_g[t] - lp_w[t]) < tol for t in lp_w)


@needs_triton
@pytest.mark.usefixtures("strict_fast_path")
def test_a_lone_short_chunk_of_a_multi_head_model_runs_in_a_partial_pack(model_factory):
    """Multi-head attention packs 16 rows; 6 new tokens after a cached prefix are a graph
    of 8 rows: one pack cut short, not a ValueError that leaves the fast path."""
    model = model_factory(preset="tiny", **SHAPES["mha"])
    fallback, llm = LLM(model, mode="fallback", **ENGINE), _fast_llm(model)
    graphs = llm.engine.runner.fast_decode
    assert isinstance(graphs, DecodeGraphs) and graphs.rows_per_pack == 16
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=2)
    for prompts in _requests()[:2]:
        for got, want in zip(llm.generate(prompts, params), fallback.generate(prompts, params)):
            _assert_same_completion(got.outputs[0], want.outputs[0])
    assert graphs.num_packed == 3  # the prefix fill's two chunks of 16 rows and the lone chunk of 6
    assert llm.engine.runner.mode == "fast" and llm.engine.block_manager.prefix.hits > 0


@needs_triton
@pytest.mark.slow
@pytest.mark.usefixtures("strict_fast_path")
@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_model_shape_stays_on_the_fast_path_and_matches_the_portable_path(model_factory, shape):
    model = model_factory(preset="tiny", **SHAPES[shape])
    fallback, llm = LLM(model, mode="fallback", **ENGINE), _fast_llm(model)
    graphs = llm.engine.runner.fast_decode
    assert isinstance(graphs, DecodeGraphs)
    for prompts in _requests():
        for got, want in zip(llm.generate(prompts, PARAMS), fallback.generate(prompts, PARAMS)):
            _assert_same_completion(got.outputs[0], want.outputs[0])
    engine = llm.engine
    assert engine.runner.mode == "fast"
    assert not engine.counters.fastpath_failures and not engine.counters.fastpath_launch_errors
    assert engine.block_manager.prefix.hits > 0
    assert graphs.num_eager > 0 and graphs.num_expanded > 0  # decode steps and chunk rows on the fused step
    assert graphs.rows_per_pack == 1 or graphs.num_packed > 0  # chunks alone in packs


# --- faults switch, launch bugs do not ----------------------------------------------------
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [30, 31, 32], [40]]


class FailingDecode:
    """Stands in for DecodeGraphs on pure decode steps: raises `error`, or with None
    computes the step through the portable forward (counting calls either way)."""

    decoder = None  # no fused forward: prefill and mixed steps run the model's own

    def __init__(self, runner, error: Exception | None):
        self.runner, self.error, self.calls = runner, error, 0

    def can_run(self, batch):
        return is_pure_decode(batch)

    def execute(self, batch):
        self.calls += 1
        if self.error is not None:
            raise self.error
        input_ids, meta, rows = self.runner.prepare(batch)
        logits = self.runner._forward(input_ids, meta, rows, self.runner.fast_attention, check=False)
        self.packed = greedy_with_flag_reference(logits)
        return logits

    def greedy(self, num_rows):
        return self.packed[: num_rows + 1]


def _with_decode(model: str, error: Exception | None) -> tuple[LLM, FailingDecode]:
    llm = LLM(model, async_scheduling=False)
    fake = llm.engine.runner.fast_decode = FailingDecode(llm.engine.runner, error)
    return llm, fake


def _tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_a_launch_bug_runs_its_step_on_the_portable_path_and_keeps_the_fast_path(tiny_model):
    expected = _tokens(LLM(tiny_model, mode="fallback").generate(PROMPTS, GREEDY))
    llm, fake = _with_decode(tiny_model, ValueError("8 rows do not split into packs of 16"))
    assert _tokens(llm.generate(PROMPTS, GREEDY)) == expected
    decode_steps = GREEDY.max_tokens - 1
    assert fake.calls == decode_steps  # tried again at every step: no demotion
    assert llm.engine.runner.mode == "fast" and llm.engine.config.mode == "fast"
    assert llm.engine.counters.fastpath_launch_errors == {"ValueError": decode_steps}
    assert not llm.engine.counters.fastpath_failures


@pytest.mark.parametrize("error", [RuntimeError("CUDA error: an illegal memory access was encountered")])
def test_a_device_fault_still_switches_to_fallback(tiny_model, error):
    llm, fake = _with_decode(tiny_model, error)
    llm.generate(PROMPTS, GREEDY)
    assert fake.calls == 1 and llm.engine.runner.mode == "fallback"
    assert llm.engine.counters.fastpath_failures == {"RuntimeError": 1}
    assert not llm.engine.counters.fastpath_launch_errors


@pytest.mark.usefixtures("strict_fast_path")
def test_strict_mode_raises_launch_bugs_and_still_switches_on_injected_faults(tiny_model):
    llm, _ = _with_decode(tiny_model, ValueError("8 rows do not split into packs of 16"))
    with pytest.raises(ValueError, match="packs of 16"):
        llm.generate(PROMPTS, GREEDY)
    llm, fake = _with_decode(tiny_model, None)
    llm.engine.add_request("r", PROMPTS[0], GREEDY)
    llm.engine.step()  # the prefill step
    llm.engine.runner.inject_fastpath_failure("test")
    while llm.engine.has_unfinished():
        llm.engine.step()
    assert llm.engine.runner.mode == "fallback" and llm.engine.counters.fastpath_failures == {"injected": 1}


def test_launch_bugs_are_our_exceptions_and_faults_the_devices():
    class CompilationError(Exception):  # Triton's, by name (fastpath_faults.TRITON_LAUNCH_BUGS)
        pass

    bugs = [ValueError("x"), AssertionError(), IndexError(), TypeError(), KeyError("k"), CompilationError()]
    faults = [
        RuntimeError("CUDA error: an illegal memory access"),
        torch.cuda.OutOfMemoryError("out of memory"),
        FastPathError("non_finite_logits", "non-finite logits"),
        FastPathError("injected", "injected"),
    ]
    assert all(is_launch_bug(e) for e in bugs)
    assert not any(is_launch_bug(e) for e in faults)
