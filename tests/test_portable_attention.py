"""The portable (fallback) path's paged attention against a float64 reference, for the
layouts where it skips the mask (one sequence: a fresh prompt, one decode token) and
those where it needs one (a cached prefix, a sliding window shorter than the context,
several sequences); and the mask built once a step, not once a layer."""

from __future__ import annotations

import pytest
import torch

from inferd.engine.model.attention import AttentionMetadata, paged_attention

BLOCK, KV_HEADS, HEADS, DIM = 4, 2, 4, 8


def reference(q, keys, values, ctx: int, window: int | None) -> torch.Tensor:
    """q [n, heads, dim]: the last n of a sequence's ctx tokens, each seeing the keys up to
    its own position (and no further back than `window`)."""
    n = q.shape[0]
    k = keys[:ctx].double().repeat_interleave(HEADS // KV_HEADS, 1)
    v = values[:ctx].double().repeat_interleave(HEADS // KV_HEADS, 1)
    out = torch.empty(n, HEADS, DIM, dtype=torch.float64)
    for i in range(n):
        pos = ctx - n + i
        first = max(0, pos - window + 1) if window else 0
        s = torch.einsum("hd,thd->ht", q[i].double(), k[first : pos + 1]) * DIM**-0.5
        out[i] = torch.einsum("ht,thd->hd", s.softmax(-1), v[first : pos + 1])
    return out


def run(seqs: list[tuple[int, int]], window: int | None = None):
    """seqs: (query_len, context_len) each. Returns (ours [T, heads, dim], reference, meta)."""
    gen = torch.Generator().manual_seed(len(seqs) * 100 + sum(c for _, c in seqs))
    blocks_each = [-(-ctx // BLOCK) for _, ctx in seqs]
    k_cache = torch.randn(sum(blocks_each) + 1, BLOCK, KV_HEADS, DIM, generator=gen)
    v_cache = torch.randn(sum(blocks_each) + 1, BLOCK, KV_HEADS, DIM, generator=gen)
    width = max(blocks_each)
    tables = torch.zeros(len(seqs), width, dtype=torch.int32)
    next_block, starts, queries, expected = 1, [], [], []
    for i, ((qlen, ctx), nb) in enumerate(zip(seqs, blocks_each)):
        pages = torch.arange(nb) + next_block  # block 0 stays free: tables pad with it
        next_block += nb
        tables[i, :nb] = pages.to(torch.int32)
        starts.append(sum(q for q, _ in seqs[:i]))
        q = torch.randn(qlen, HEADS, DIM, generator=gen)
        queries.append(q)
        keys = k_cache[pages].reshape(-1, KV_HEADS, DIM)
        values = v_cache[pages].reshape(-1, KV_HEADS, DIM)
        expected.append(reference(q, keys, values, ctx, window))
    meta = AttentionMetadata(
        query_start=starts,
        query_lens=[q for q, _ in seqs],
        context_lens=torch.tensor([c for _, c in seqs]),
        block_tables=tables,
        slot_mapping=torch.zeros(0, dtype=torch.long),
        positions=torch.zeros(0, dtype=torch.long),
        max_query_len=max(q for q, _ in seqs),
        max_context_len=max(c for _, c in seqs),
        sliding_window=window,
    )
    ours = paged_attention(torch.cat(queries), k_cache, v_cache, meta, DIM**-0.5)
    return ours, torch.cat(expected), meta


@pytest.mark.parametrize(
    "seqs, window, masked",
    [
        ([(1, 13)], None, False),  # one decode token: sees its whole context
        ([(10, 10)], None, False),  # a fresh prompt: causal
        ([(10, 10)], 16, False),  # a window longer than the context changes nothing
        ([(5, 13)], None, True),  # after a cached prefix
        ([(1, 13)], 6, True),  # a window shorter than the context
        ([(10, 10)], 4, True),
        ([(1, 13), (1, 7)], None, True),  # two sequences: padding
        ([(10, 10), (3, 9)], None, True),
    ],
)
def test_portable_attention_matches_the_reference(seqs, window, masked):
    ours, expected, meta = run(seqs, window)
    torch.testing.assert_close(ours.double(), expected, rtol=1e-4, atol=1e-5)
    mask, _ = meta.sdpa_mask(torch.device("cpu"))
    assert (mask is not None) == masked


def test_the_mask_is_built_once_a_step():
    _, _, meta = run([(5, 13), (1, 7)])
    first = meta.sdpa_mask(torch.device("cpu"))[0]
    assert first is not None and meta.sdpa_mask(torch.device("cpu"))[0] is first
