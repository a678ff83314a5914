"""The sampler's Triton kernels (engine/sampling/triton_draw.py) against their definitions
and the torch code they replace on CUDA, in Triton's CPU interpreter."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from inferd.engine.request.sampling_params import SamplingParams
from inferd.engine.request.sequence import Sequence
from inferd.engine.sampling import filters, noise, triton_draw
from inferd.engine.sampling.draw import draw_reference
from inferd.engine.sampling.sampler import sample
from inferd.engine.sampling.slot_params import as_int64
from inferd.engine.sampling.triton_draw import CHUNK, FAN, draw_tokens, passes_for, top_p_threshold, uniform_bits

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


@pytest.mark.parametrize("split", [1, 4])  # one program a row; slices of a row, a launch per pass
@pytest.mark.parametrize("vocab,seed", [(1000, 0), (4999, 1)])
def test_top_p_threshold_is_the_definition_and_the_torch_bisection(vocab, seed, split):
    probs, ps, expected = _rows_and_ps(vocab, seed)
    got = top_p_threshold(probs, ps, split=split)
    assert got.dtype == torch.int32 and got.shape == (len(expected),)
    assert got.tolist() == expected
    assert filters.top_p_threshold(probs, ps).tolist() == expected
    assert expected.count(0) == 4 and expected.count(0x3F800000) >= 5  # the one-hot row keeps its 1.0


@pytest.mark.parametrize("split", [1, 4])
def test_top_p_threshold_needs_every_pass(split):
    probs, ps, expected = _rows_and_ps(1000, 0)
    short = top_p_threshold(probs, ps, passes=passes_for(FAN) - 1, split=split)  # FAN^(passes - 1) < 0x3F800001
    wrong = [i for i, (a, b) in enumerate(zip(short.tolist(), expected)) if a != b]
    assert len(wrong) >= len(expected) // 2


def test_top_p_threshold_reads_strided_rows():
    probs, ps, expected = _rows_and_ps(1000, 2)
    wide = torch.zeros(probs.shape[0], 1100)
    wide[:, :1000] = probs
    assert top_p_threshold(wide[:, :1000], ps, split=1).tolist() == expected
    assert top_p_threshold(wide[:, :1000], ps, split=8).tolist() == expected


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


@pytest.mark.parametrize("engine_key,draw_number", [(0, 0), (1, 1), (-(1 << 63), 7), ((1 << 63) - 1, (1 << 31) + 5)])
def test_noise_streams_in_one_launch_are_the_torch_streams(engine_key, draw_number):
    n = 300  # past one block of the kernel
    g = torch.Generator().manual_seed(3)
    seed_keys = torch.randint(-(1 << 62), 1 << 62, (n,), generator=g) * 2 + torch.randint(0, 2, (n,), generator=g)
    seed_keys[:3] = torch.tensor([-(1 << 63), (1 << 63) - 1, -1])
    is_seeded = torch.randint(0, 2, (n,), generator=g)
    positions = torch.randint(0, 1 << 20, (n,), generator=g)
    slots = torch.randperm(n, generator=g)
    draw_base = as_int64(draw_number << 32)
    got = triton_draw.noise_streams(seed_keys, is_seeded, positions, slots, engine_key, draw_base)
    want = torch.where(
        is_seeded != 0,
        noise.row_streams(seed_keys, positions),
        noise.row_streams(torch.full_like(slots, engine_key), slots + draw_base),
    )
    assert torch.equal(got, want)
    assert not torch.equal(
        got, triton_draw.noise_streams(seed_keys, is_seeded, positions, slots, engine_key ^ 1, draw_base)
    )


def test_count_at_least_is_the_torch_count():
    g = torch.Generator().manual_seed(6)
    values = torch.randint(-3, 4, (5, 2500), generator=g).float()  # many ties at each floor
    values[1, 7] = float("nan")
    values[2] = float("-inf")
    floors = torch.tensor([0.0, 1.0, float("-inf"), 3.0, 4.0])
    got = triton_draw.count_at_least(values, floors)
    assert got.dtype == torch.int64 and got.tolist() == (values >= floors[:, None]).sum(dim=-1).tolist()
    assert got[2] == 2500 and got[4] == 0


def _reference_draw(logits, temperature, floors, streams) -> tuple[torch.Tensor, torch.Tensor]:
    """draw.py's torch tokens, and per row whether its best two scores are clear of a
    last-ulp difference in the logs (a gap over 1e-4)."""
    kept = logits >= floors[:, None]
    scores = logits / temperature[:, None] - torch.log(noise.exponential(streams, logits.shape[1]))
    top2 = torch.where(kept, scores, float("-inf")).double().topk(2, dim=-1).values
    return draw_reference(logits, temperature, floors, streams), (top2[:, 0] - top2[:, 1]) > 1e-4


def _no_floor(rows: int) -> torch.Tensor:
    return torch.full((rows,), float("-inf"))


@pytest.mark.parametrize("vocab", [1000, 2 * CHUNK + 37])
def test_draw_tokens_are_the_torch_draw(vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(16, vocab, generator=g) * 2.0
    temperature = torch.rand(16, generator=g) + 0.3
    floors = torch.cat([_no_floor(8), logits[8:].topk(40, dim=-1).values[:, -1]])  # filtered rows
    streams = _streams(16, 5)
    want, clear = _reference_draw(logits, temperature, floors, streams)
    got = draw_tokens(logits, temperature, floors, streams)
    assert got.dtype == torch.int64
    assert int(clear.sum()) >= 14
    assert got[clear].tolist() == want[clear].tolist()
    assert (logits.gather(1, got[:, None])[:, 0] >= floors).all()
    bf16 = logits.to(torch.bfloat16)
    want_bf16, clear_bf16 = _reference_draw(bf16.float(), temperature, floors, streams)
    got_bf16 = draw_tokens(bf16, temperature, floors, streams)  # read as they are, widened in the kernel
    assert got_bf16[clear_bf16].tolist() == want_bf16[clear_bf16].tolist()


def test_seeded_rows_draw_the_same_alone_and_in_a_batch():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(5, 2000, generator=g)
    t, f = torch.ones(5), _no_floor(5)
    streams = _streams(5, 9)
    together = draw_tokens(logits, t, f, streams).tolist()
    alone = [draw_tokens(logits[i : i + 1], t[:1], f[:1], streams[i : i + 1]).item() for i in range(5)]
    reversed_batch = draw_tokens(logits.flip(0), t, f, streams.flip(0)).flip(0).tolist()
    assert together == alone == reversed_batch
    assert len(set(together)) > 1
    assert draw_tokens(logits[:1], t[:1], f[:1], _streams(5, 10)[:1]).item() != together[0]  # another stream


@pytest.mark.filterwarnings("ignore:overflow encountered")  # the interpreter's numpy divide
def test_draw_ties_take_the_lowest_index_across_lanes_and_chunks():
    """A logit of float32's largest at temperature 0.5 scores inf whatever its noise: those
    tokens tie, and the first wins, as torch.argmax's first maximum."""
    vocab = 2 * CHUNK + 10
    streams = _streams(3, 11)
    lane = 17
    cols = [
        [lane + 1024, lane, lane + CHUNK, lane + 1],  # one lane, its later block and chunk, another lane
        [2 * CHUNK + 1, CHUNK + 9],  # the first in the second chunk
        [2 * CHUNK, 1],  # the last chunk's and the first's
    ]
    logits = torch.zeros(3, vocab)
    for row, cs in enumerate(cols):
        logits[row, cs] = torch.finfo(torch.float32).max
    first = [min(cs) for cs in cols]
    t, f = torch.full((3,), 0.5), _no_floor(3)
    assert draw_reference(logits, t, f, streams).tolist() == first
    assert draw_tokens(logits, t, f, streams).tolist() == first


def test_a_row_with_nothing_to_draw_from_takes_the_argmax():
    logits = torch.zeros(5, 1500)
    logits[0] = float("-inf")
    logits[1, 900] = float("nan")
    logits[1, 1200] = 0.5
    logits[2, 3] = float("inf")
    logits[3, 700] = 0.25
    floors = torch.tensor([float("-inf"), float("-inf"), float("-inf"), 1.0, 0.0])  # row 3: nothing reaches it
    t = torch.ones(5)
    assert draw_reference(logits, t, floors, _streams(5, 13)).tolist()[:4] == [-1, -1, -1, -1]
    got = draw_tokens(logits, t, floors, _streams(5, 13)).tolist()
    assert got[:4] == [0, 1200, 3, 700] and logits[4, got[4]] >= 0.0


def test_greedy_rows_take_the_argmax_in_the_same_pass():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 2 * CHUNK + 3, generator=g)
    logits[1, 5] = logits[1, CHUNK + 7] = 9.0  # a tie: the first wins
    is_greedy = torch.tensor([1, 1, 0, 1, 0, 1])
    floors, streams = _no_floor(6), _streams(6, 2)
    got = draw_tokens(logits, torch.ones(6), floors, streams, is_greedy)
    argmax = logits.argmax(dim=-1)
    assert got[is_greedy == 1].tolist() == argmax[is_greedy == 1].tolist() and got[1] == 5
    sampled = draw_tokens(logits, torch.ones(6), floors, streams)
    assert got[is_greedy == 0].tolist() == sampled[is_greedy == 0].tolist()
    assert sampled.tolist() != argmax.tolist()  # drawn, these rows would differ


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
    """Hash bits 2^24 - 1 round u to 1.0 in float32, and -log(1.0) = -0, whose log is -inf:
    E is floored (noise.MIN_EXPONENTIAL), so that token scores high but finite, and a token
    below its row's floor is never drawn, whatever its noise."""
    token, vocab = 5, 300
    stream = (_unmix64(0xFFFFFF0000000000) - token * 0x9E3779B97F4A7C15) & M64
    streams = torch.tensor([stream - (1 << 64) if stream >> 63 else stream], dtype=torch.int64)
    assert uniform_bits(streams, vocab)[0, token] == (1 << 24) - 1
    assert noise.uniform(streams, vocab)[0, token] == 1.0
    logits = torch.zeros(1, vocab)
    logits[0, token] = -1.0
    t, floor = torch.ones(1), torch.zeros(1)  # the token lies below the floor
    assert draw_tokens(logits, t, floor, streams).item() != token
    assert draw_reference(logits, t, floor, streams).item() != token
    floor = torch.full((1,), -1.0)  # kept, it wins: E is the smallest there is
    assert draw_tokens(logits, t, floor, streams).item() == token == draw_reference(logits, t, floor, streams).item()


def test_the_sampler_draws_the_same_through_the_kernels(monkeypatch):
    """draw.py's CUDA path (forced onto the interpreter) against its CPU path, over rows
    with temperature, top-k, top-p, min-p and seeds: top-p over whole rows (a row without
    top-k) through the threshold kernel, then top-p within the top-k alone."""
    vocab = 700
    params = [
        dict(temperature=1.0),
        dict(temperature=0.7, top_p=0.9, top_k=50),
        dict(temperature=1.0, top_p=0.8),
        dict(temperature=0.9, top_p=0.95, min_p=0.02, seed=3),
        dict(temperature=1.2, seed=4),
        dict(temperature=0.0),
    ] * 3
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
    assert searched == [len(seqs)]
    within = [i for i, p in enumerate(params) if "top_k" in p or p["temperature"] == 0.0]
    within_seqs = [seqs[i] for i in within]
    monkeypatch.undo()
    want = sample(logits[within], within_seqs, [2], seed=21)[0]
    monkeypatch.setattr(triton_draw, "is_enabled", lambda device: True)
    monkeypatch.setattr(triton_draw, "top_p_threshold", lambda *a, **k: searched.append(a[0].shape[0]))
    assert sample(logits[within], within_seqs, [2], seed=21)[0] == want
    assert searched == [len(seqs)]  # no whole-row search when every drawing row has a top-k
    monkeypatch.setenv(triton_draw.ENV_SWITCH, "0")
    monkeypatch.undo()
    assert not triton_draw.is_enabled(torch.device("cpu"))
