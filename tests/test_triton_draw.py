"""The sampler's Triton kernels (engine/sampling/triton_draw.py) against their definitions
and the torch code they replace on CUDA, in Triton's CPU interpreter."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from inferd.engine.sampler import sample
from inferd.engine.sampling import filters, noise, triton_draw
from inferd.engine.sampling.draw import MIN_ROWS_FOR_TOP_P_KERNEL
from inferd.engine.sampling.triton_draw import CHUNK, TOP_P_PASSES, draw_tokens, top_p_threshold, uniform_bits
from inferd.engine.sampling_params import SamplingParams
from inferd.engine.sequence import Sequence

pytestmark = pytest.mark.skipif(
    not triton_draw.HAS_TRITON or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton (pip) with TRITON_INTERPRET=1 for its CPU interpreter",
)

M64 = (1 << 64) - 1


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def _rows_and_ps(vocab: int, seed: int):
    """Rows (peaked, flat, tied, one-hot) with, per row, p values midway between two
    consecutive masses of the row's distinct probabilities (float64), so that any float32
    summation order agrees on the set; and each p's threshold by the definition."""
    g = torch.Generator().manual_seed(seed)
    tied = torch.softmax(torch.randint(0, 6, (vocab,), generator=g).float() * 1.5, -1)  # six levels, many ties
    one_hot = torch.zeros(vocab)
    one_hot[vocab // 3] = 1.0
    rows = [
        torch.softmax(torch.randn(vocab, generator=g) * 3.0, -1),
        torch.softmax(torch.randn(vocab, generator=g) * 0.5, -1),
        tied,
        one_hot,
    ]
    probs, ps, expected = [], [], []
    for row in rows:
        values = torch.unique(row.double(), sorted=True).flip(0)  # distinct, descending
        mass = torch.stack([row.double()[row.double() >= v].sum() for v in values[:64]])
        wide = [i for i in range(len(mass)) if i == 0 or mass[i] - mass[i - 1] > 1e-4]  # a clear step
        for i in wide[:: max(1, len(wide) // 4)]:
            below = mass[i - 1] if i else 0.0
            ps.append(float(below + mass[i]) / 2)
            expected.append(int(_bits(values[i].float().view(1))))
            probs.append(row)
        probs += [row, row]
        ps += [1.0, 0.0]  # p = 1 keeps every token; p = 0 passes every candidate below 1.0's pattern
        expected += [0, 0x3F800000]
    return torch.stack(probs), torch.tensor(ps), expected


@pytest.mark.parametrize("vocab,seed", [(1000, 0), (4999, 1)])
def test_top_p_threshold_is_the_definition_and_the_torch_bisection(vocab, seed):
    probs, ps, expected = _rows_and_ps(vocab, seed)
    got = top_p_threshold(probs, ps)
    assert got.dtype == torch.int32 and got.shape == (len(expected),)
    assert got.tolist() == expected
    assert filters.top_p_threshold(probs, ps).tolist() == expected
    assert expected.count(0) == 4 and expected.count(0x3F800000) >= 5  # the one-hot row keeps its 1.0


@pytest.mark.parametrize("vocab,seed", [(1000, 0), (4999, 1)])
def test_the_fan_out_search_for_few_rows_is_the_definition_too(vocab, seed):
    """filters.top_p_threshold_fanout (the GPU's search below MIN_ROWS_FOR_TOP_P_KERNEL rows)."""
    probs, ps, expected = _rows_and_ps(vocab, seed)
    assert filters.top_p_threshold_fanout(probs, ps).tolist() == expected


def test_the_fan_out_search_needs_every_pass(monkeypatch):
    probs, ps, expected = _rows_and_ps(1000, 0)
    monkeypatch.setattr(filters, "TOP_P_FAN_PASSES", filters.TOP_P_FAN_PASSES - 1)
    short = filters.top_p_threshold_fanout(probs, ps).tolist()
    assert sum(a != b for a, b in zip(short, expected)) >= len(expected) // 2


def test_top_p_threshold_needs_every_pass():
    probs, ps, expected = _rows_and_ps(1000, 0)
    short = top_p_threshold(probs, ps, passes=TOP_P_PASSES - 1)  # 16^7 < 0x3F800001: not pinned
    wrong = [i for i, (a, b) in enumerate(zip(short.tolist(), expected)) if a != b]
    assert len(wrong) >= len(expected) // 2


def test_top_p_threshold_reads_strided_rows():
    probs, ps, expected = _rows_and_ps(1000, 2)
    wide = torch.zeros(probs.shape[0], 1100)
    wide[:, :1000] = probs
    assert top_p_threshold(wide[:, :1000], ps).tolist() == expected


def _streams(n: int, seed: int) -> torch.Tensor:
    keys = torch.arange(n, dtype=torch.int64) * 7919 + seed
    return noise.row_streams(keys, torch.arange(n, dtype=torch.int64) + (seed << 40))


def test_noise_bits_are_noise_uniforms():
    streams = torch.cat([_streams(6, 3), torch.tensor([0, -1, (1 << 63) - 1, -(1 << 63)])])
    vocab = 3000
    cols = torch.arange(vocab, dtype=torch.int64)
    reference = noise._shift_right(noise.mix64(streams[:, None] + cols[None, :] * noise._GOLDEN), 40)
    bits = uniform_bits(streams, vocab)
    assert torch.equal(bits.long(), reference)
    u = (bits.float() + 0.5) * (1.0 / (1 << noise.UNIFORM_BITS))
    assert torch.equal(u, noise.uniform(streams, vocab))


def _reference_draw(probs: torch.Tensor, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """draw.py's torch tokens, and per row whether its best two scores are clear of a
    last-ulp difference in -log (relative gap over 1e-5)."""
    scores = probs / noise.exponential(streams, probs.shape[1])
    top2 = scores.double().topk(2, dim=-1).values
    return scores.argmax(dim=-1), (top2[:, 0] - top2[:, 1]) > 1e-5 * top2[:, 0]


@pytest.mark.parametrize("vocab", [1000, 2 * CHUNK + 37])
def test_draw_tokens_are_the_torch_draw(vocab):
    g = torch.Generator().manual_seed(vocab)
    probs = torch.softmax(torch.randn(16, vocab, generator=g) * 2.0, -1)
    probs[8:] = torch.where(probs[8:] >= probs[8:].topk(40, dim=-1).values[:, -1:], probs[8:], 0.0)  # filtered rows
    streams = _streams(16, 5)
    want, clear = _reference_draw(probs, streams)
    got = draw_tokens(probs, streams)
    assert got.dtype == torch.int64
    assert int(clear.sum()) >= 14
    assert got[clear].tolist() == want[clear].tolist()
    assert (probs.gather(1, got[:, None]) > 0).all()


def test_seeded_rows_draw_the_same_alone_and_in_a_batch():
    g = torch.Generator().manual_seed(7)
    probs = torch.softmax(torch.randn(5, 2000, generator=g), -1)
    streams = _streams(5, 9)
    together = draw_tokens(probs, streams).tolist()
    alone = [draw_tokens(probs[i : i + 1], streams[i : i + 1]).item() for i in range(5)]
    reversed_batch = draw_tokens(probs.flip(0), streams.flip(0)).flip(0).tolist()
    assert together == alone == reversed_batch
    assert len(set(together)) > 1
    assert draw_tokens(probs[:1], _streams(5, 10)[:1]).item() != together[0]  # another stream, another token


@pytest.mark.filterwarnings("ignore:overflow encountered")  # the interpreter's numpy divide
def test_draw_ties_take_the_lowest_index_across_lanes_and_chunks():
    """p = float32's largest over E < 1 overflows the score to inf whatever the last ulp
    of -log: those tokens tie, and the first wins, as torch.argmax's first maximum."""
    vocab = 2 * CHUNK + 10
    streams = _streams(3, 11)
    clear = noise.exponential(streams, vocab) < 0.9  # E clearly below 1

    def at(row: int, col: int, step: int = 1) -> int:  # the first clear column from col, by step
        return col + step * int(torch.nonzero(clear[row, col::step])[0])

    lane = next(c for c in range(1024) if clear[0, c] and clear[0, c + 1024] and clear[0, c + CHUNK])
    cols = [
        [lane + 1024, lane, lane + CHUNK, at(0, lane + 1)],  # one lane, its later block and chunk, another lane
        [at(1, 2 * CHUNK + 1), at(1, CHUNK + 9)],  # the first in the second chunk
        [at(2, 2 * CHUNK), at(2, 1)],  # the last chunk's and the first's
    ]
    probs = torch.zeros(3, vocab)
    for row, cs in enumerate(cols):
        probs[row, cs] = torch.finfo(torch.float32).max
    first = [lane, cols[1][1], cols[2][1]]
    assert first == [min(cs) for cs in cols] and CHUNK <= first[1] < 2 * CHUNK
    assert (probs / noise.exponential(streams, vocab)).argmax(dim=-1).tolist() == first
    assert draw_tokens(probs, streams).tolist() == first


def test_a_row_with_nothing_to_draw_from_gets_minus_one():
    probs = torch.full((4, 1500), 1.0 / 1500)
    probs[0] = 0.0
    probs[1, 900] = float("nan")
    probs[2, 3] = float("inf")
    got = draw_tokens(probs, _streams(4, 13)).tolist()
    assert got[:3] == [-1, -1, -1] and got[3] >= 0


def _unmix64(z: int) -> int:
    """The inverse of noise.mix64 on Python ints."""

    def unshift(y: int, bits: int) -> int:
        x, shift = y, bits
        while shift < 64:
            x ^= y >> shift
            shift += bits
        return x

    z = unshift(z, 31)
    z = unshift(z * pow(0x94D049BB133111EB, -1, 1 << 64) & M64, 27)
    return unshift(z * pow(0xBF58476D1CE4E5B9, -1, 1 << 64) & M64, 30)


def test_a_filtered_token_with_the_top_hash_is_never_drawn():
    """Hash bits 2^24 - 1 round u to 1.0 in float32: E = -0 made p / E NaN for p = 0,
    which torch.argmax takes as the maximum. E is floored (noise.MIN_EXPONENTIAL) instead."""
    token, vocab = 5, 300
    stream = (_unmix64(0xFFFFFF0000000000) - token * 0x9E3779B97F4A7C15) & M64
    streams = torch.tensor([stream - (1 << 64) if stream >> 63 else stream], dtype=torch.int64)
    assert uniform_bits(streams, vocab)[0, token] == (1 << 24) - 1
    probs = torch.full((1, vocab), 1.0 / (vocab - 1))
    probs[0, token] = 0.0
    assert noise.uniform(streams, vocab)[0, token] == 1.0
    assert (probs / -torch.log(noise.uniform(streams, vocab))).argmax().item() == token  # the old draw
    assert _reference_draw(probs, streams)[0].item() != token
    assert draw_tokens(probs, streams).item() != token
    probs[0, token] = 1e-6  # kept, it wins: E is the smallest there is
    assert draw_tokens(probs, streams).item() == token == _reference_draw(probs, streams)[0].item()


def test_the_sampler_draws_the_same_through_the_kernels(monkeypatch):
    """draw.py's CUDA path (forced onto the interpreter) against its CPU path, over rows
    with temperature, top-k, top-p, min-p and seeds."""
    vocab = 700
    params = [
        dict(temperature=1.0),
        dict(temperature=0.7, top_p=0.9, top_k=50),
        dict(temperature=1.0, top_p=0.8),
        dict(temperature=0.9, top_p=0.95, min_p=0.02, seed=3),
        dict(temperature=1.2, seed=4),
        dict(temperature=0.0),
    ] * 3  # past draw.MIN_ROWS_FOR_TOP_P_KERNEL, so the threshold kernel runs too
    seqs = [Sequence(f"s{i}", 0, [1, 2, 3], SamplingParams(max_tokens=4, **p), 0, 0.0, 0) for i, p in enumerate(params)]
    logits = torch.randn(len(seqs), vocab, generator=torch.Generator().manual_seed(17)) * 3.0
    torch_tokens, _ = sample(logits, seqs, [2], seed=21)
    used, searched = [], []
    threshold = triton_draw.top_p_threshold
    monkeypatch.setattr(triton_draw, "is_enabled", lambda device: used.append(device) or True)
    monkeypatch.setattr(
        triton_draw, "top_p_threshold", lambda *a, **k: searched.append(a[0].shape[0]) or threshold(*a, **k)
    )
    kernel_tokens, _ = sample(logits, seqs, [2], seed=21)
    assert used and kernel_tokens == torch_tokens
    assert searched == [len(seqs)] and len(seqs) >= MIN_ROWS_FOR_TOP_P_KERNEL
    few = seqs[: MIN_ROWS_FOR_TOP_P_KERNEL - 1]
    fanned = []
    fanout = filters.top_p_threshold_fanout
    monkeypatch.setattr(filters, "top_p_threshold_fanout", lambda *a: fanned.append(a[0].shape[0]) or fanout(*a))
    assert sample(logits[: len(few)], few, [2], seed=21)[0] == torch_tokens[: len(few)]
    assert searched == [len(seqs)] and fanned == [len(few)]  # fewer rows: the torch fan-out search
    monkeypatch.setenv(triton_draw.ENV_SWITCH, "0")
    monkeypatch.undo()
    assert not triton_draw.is_enabled(torch.device("cpu"))
