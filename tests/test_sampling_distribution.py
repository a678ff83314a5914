"""The device sampler's distributions, noise and slot bookkeeping (engine/sampling/).

Chi-square tests draw many unseeded copies of one row and compare the token counts with
the exact top-k/top-p/min-p-filtered softmax computed in float64 with a full sort; each
filter is also shown to fail the same test when deliberately wrong (an off-by-one top-k,
a top-p set one token short, a min-p threshold doubled).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from inferd.engine.request.sampling_params import SamplingParams
from inferd.engine.request.sequence import Sequence
from inferd.engine.sampling import filters, noise
from inferd.engine.sampling.sampler import Sampler, sample
from inferd.engine.scheduling.slot_table import SlotTable

VOCAB = 64
NUM_DRAWS = 12000
EOS = [1]


def exact_probs(logits: torch.Tensor, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    """The filtered distribution, float64, by a full sort (ties broken by order: none here)."""
    x = logits.double() / temperature
    order = torch.argsort(x, descending=True)
    keep = torch.ones(VOCAB, dtype=torch.bool)
    if 0 < top_k < VOCAB:
        keep[order[top_k:]] = False
    probs = torch.softmax(x.masked_fill(~keep, float("-inf")), dim=-1)
    if top_p < 1.0:
        sorted_probs = probs[order]
        before = sorted_probs.cumsum(0) - sorted_probs  # mass of the more probable tokens
        keep[order[before >= top_p]] = False
    probs = torch.softmax(x.masked_fill(~keep, float("-inf")), dim=-1)
    if min_p > 0.0:
        keep &= probs >= min_p * probs.max()
    probs = torch.softmax(x.masked_fill(~keep, float("-inf")), dim=-1)
    return probs.numpy()


def draw_counts(logits: torch.Tensor, seed: int = 0, **params) -> np.ndarray:
    seq = Sequence("r", 0, [2, 3], SamplingParams(max_tokens=8, **params), 0, 0.0, 0)
    tokens, _ = sample(logits.expand(NUM_DRAWS, VOCAB), [seq] * NUM_DRAWS, EOS, seed=seed)
    return np.bincount(tokens, minlength=VOCAB)


def chi_square_p(counts: np.ndarray, expected: np.ndarray) -> float:
    """p-value of the counts under `expected`; 0 when a token outside its support was drawn.
    Cells expecting fewer than 5 draws are pooled."""
    if counts[expected == 0].sum():
        return 0.0
    want = expected * counts.sum()
    big = want >= 5
    observed = np.append(counts[big], counts[~big].sum())
    wanted = np.append(want[big], want[~big].sum())
    if wanted[-1] == 0:
        observed, wanted = observed[:-1], wanted[:-1]
    return float(chisquare(observed, wanted).pvalue)


def peaked_logits(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(VOCAB, generator=g) * 1.5  # distinct values: a strict order


CASES = [
    dict(temperature=1.0),
    dict(temperature=0.7),
    dict(temperature=1.3, top_k=8),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=1.0, min_p=0.1),
    dict(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05),
]


@pytest.mark.parametrize("params", CASES, ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()))
def test_sampled_frequencies_match_the_filtered_softmax(params):
    logits = peaked_logits(7)
    assert chi_square_p(draw_counts(logits, **params), exact_probs(logits, **params)) > 1e-3


RIGHT_TOP_K, RIGHT_TOP_P, RIGHT_MIN_P = filters.top_k_floor, filters.top_p_keep, filters.min_p_floor
RIGHT_TOP_P_WITHIN = filters.top_p_floor_within_top_k


def _top_k_one_short(largest, top_k):
    return RIGHT_TOP_K(largest, top_k - 1)


def _top_p_one_short(probs, top_p):
    keep = RIGHT_TOP_P(probs, top_p)
    smallest_kept = torch.where(keep, probs, 2.0).argmin(dim=-1)
    return keep.scatter(1, smallest_kept[:, None], False)


def _top_p_within_one_short(largest, kth, ties_beyond, temperature, top_p):
    floor = RIGHT_TOP_P_WITHIN(largest, kth, ties_beyond, temperature, top_p)
    kept = (largest >= floor[:, None]).sum(dim=-1)
    return largest.gather(1, (kept - 2).clamp(min=0)[:, None])[:, 0]  # the next larger logit


def _min_p_doubled(max_logit, temperature, min_p):
    return RIGHT_MIN_P(max_logit, temperature, 2 * min_p)


@pytest.mark.parametrize(
    ("params", "name", "wrong"),
    [
        (dict(temperature=1.3, top_k=8), "top_k_floor", _top_k_one_short),
        (dict(temperature=1.0, top_p=0.8), "top_p_keep", _top_p_one_short),
        (dict(temperature=0.8, top_k=20, top_p=0.9), "top_p_floor_within_top_k", _top_p_within_one_short),
        (dict(temperature=1.0, min_p=0.1), "min_p_floor", _min_p_doubled),
    ],
    ids=["top_k-one-short", "top_p-one-short", "top_p-within-top_k-one-short", "min_p-doubled"],
)
def test_the_chi_square_test_catches_a_wrong_filter(monkeypatch, params, name, wrong):
    monkeypatch.setattr(filters, name, wrong)
    logits = peaked_logits(7)
    assert chi_square_p(draw_counts(logits, **params), exact_probs(logits, **params)) < 1e-6


def _reference_kept(row: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """The filters' definitions in float64 over a whole row, ties kept together."""
    x = row.double()
    keep = torch.ones_like(x, dtype=torch.bool)
    if top_k:
        keep &= x >= x.topk(top_k).values[-1]
    probs = torch.softmax(torch.where(keep, x / temperature, float("-inf")), dim=-1)
    if top_p < 1.0:
        values = torch.unique(probs[keep]).flip(0)  # distinct, descending
        mass = torch.stack([probs[probs >= v].sum() for v in values])
        keep &= probs >= values[int(torch.nonzero(mass >= top_p)[0])]
    if min_p:
        keep &= probs >= min_p * probs.max()
    return keep


@pytest.mark.parametrize("within", [True, False], ids=["within-top_k", "whole-row"])
def test_floors_keep_the_defined_sets_with_ties_beyond_the_top_k(monkeypatch, within):
    """Rows of few distinct values (long runs of ties at the k-th largest) through
    draw.keep_floors, both top-p paths, against the float64 definitions."""
    from inferd.engine.sampling import draw

    if not within:
        monkeypatch.setattr(draw, "MAX_TOP_K_WITHIN", 0)
    g = torch.Generator().manual_seed(11)
    specs = [(0.7, 5, 0.9, 0.0), (1.0, 3, 0.5, 0.0), (1.3, 12, 0.95, 0.02), (0.9, 40, 0.8, 0.0), (1.0, 8, 1.0, 0.1)]
    rows, seqs = [], []
    for i, (t, k, p, m) in enumerate(specs * 4):
        rows.append(torch.randint(0, 7, (VOCAB,), generator=g).float() * 0.75)
        seqs.append(Sequence(f"r{i}", 0, [2], SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m), 0, 0.0, 0))
    logits = torch.stack(rows)
    sampler = Sampler(torch.device("cpu"), VOCAB, EOS)
    batch = sampler.slots.gather(seqs, list(range(len(seqs))))
    assert batch.top_k_everywhere
    floors = draw.keep_floors(logits, batch)
    # Three tokens at 2.0 and 61 tied at 0.0, top_k 5 alone: the top-p mass of the 2.0s is
    # 0.27 counting every tie of the k-th value, 0.92 counting those among the 5 largest.
    tied = torch.zeros(1, VOCAB)
    tied[0, [3, 30, 60]] = 2.0
    seq = Sequence("tied", 0, [2], SamplingParams(temperature=1.0, top_k=5, top_p=0.5), 0, 0.0, 0)
    tied_floor = draw.keep_floors(tied, Sampler(torch.device("cpu"), VOCAB, EOS).slots.gather([seq], [0]))
    assert tied_floor.tolist() == [0.0]
    logits, floors = torch.cat([logits, tied]), torch.cat([floors, tied_floor])
    specs_all = specs * 4 + [(1.0, 5, 0.5, 0.0)]
    for row, floor, (t, k, p, m) in zip(logits, floors, specs_all):
        want = _reference_kept(row, t, k, p, m)
        assert torch.equal(row >= floor, want), (t, k, p, m)
    kept_past_k = [int((row >= floor).sum()) > k for row, floor, (_, k, _, _) in zip(logits, floors, specs_all)]
    assert sum(kept_past_k) >= 5  # ties of the k-th value were kept


def test_top_p_bisection_finds_the_sorted_threshold_exactly():
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(64, 1000, generator=g) * 3, dim=-1)
    top_p = torch.rand(64, generator=g) * 0.98 + 0.01
    keep = filters.top_p_keep(probs, top_p)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cumulative = sorted_probs.cumsum(dim=-1)
    # The smallest prefix reaching top_p, up to the float32 rounding of the two sums.
    needed = (cumulative < top_p[:, None] - 1e-5).sum(dim=-1) + 1
    assert torch.equal(keep.sum(dim=-1), needed)
    assert torch.equal(keep.gather(1, order[:, :1]), torch.ones(64, 1, dtype=torch.bool))


def test_noise_is_splitmix64_and_uniform_in_the_open_interval():
    def splitmix64(x: int) -> int:
        m = (1 << 64) - 1
        z = x & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    values = [0, 1, 12345, (1 << 63) - 1, -1, -(1 << 63)]
    got = noise.mix64(torch.tensor(values, dtype=torch.int64)).tolist()
    assert [g & ((1 << 64) - 1) for g in got] == [splitmix64(v) for v in values]
    u = noise.uniform(noise.row_streams(torch.arange(4), torch.zeros(4, dtype=torch.int64)), 5000)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01
    assert not torch.equal(u[0], u[1])


def test_seeded_requests_repeat_exactly_across_samplers_and_batches():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))

    def run(engine_seed, slots, order):
        seqs = [Sequence(f"r{i}", 0, [2], SamplingParams(temperature=1.0, top_k=30, seed=i), 0, 0.0, 0) for i in order]
        sampler = Sampler(torch.device("cpu"), VOCAB, EOS, seed=engine_seed)
        tokens = sampler.sample(logits[list(order)], seqs, slots=slots)[0]
        return dict(zip(order, tokens))

    assert run(0, [0, 1, 2], (0, 1, 2)) == run(5, [7, 3, 4], (2, 0, 1))


def test_penalty_rows_are_rebuilt_when_a_token_arrives_outside_the_sampler():
    """A greedy row with a frequency penalty: after a token appended without a draw (the
    sampler never saw it), the next step still penalises it."""
    logits = torch.zeros(1, VOCAB)
    logits[0, 5] = 1.0
    logits[0, 6] = 0.9
    seq = Sequence("r", 0, [2], SamplingParams(temperature=0.0, frequency_penalty=0.5), 0, 0.0, 0)
    sampler = Sampler(torch.device("cpu"), VOCAB, EOS)
    assert sampler.sample(logits, [seq], slots=[0])[0] == [5]
    seq.append_token(5)
    assert sampler.sample(logits, [seq], slots=[0])[0] == [6]  # 5 now scores 0.5
    seq.append_token(6)
    seq.append_token(6)  # not drawn by the sampler
    assert sampler.sample(logits, [seq], slots=[0])[0] == [5]  # 6 scores 0.9 - 1.0


def test_a_new_occupant_of_a_slot_gets_its_own_parameters():
    logits = torch.zeros(1, VOCAB)
    logits[0, 9] = 5.0
    sampler = Sampler(torch.device("cpu"), VOCAB, EOS)
    banned = Sequence("a", 0, [2], SamplingParams(temperature=0.0, logit_bias={9: -100.0}), 0, 0.0, 0)
    plain = Sequence("b", 0, [2], SamplingParams(temperature=0.0, logprobs=0), 0, 0.0, 0)
    assert sampler.sample(logits, [banned], slots=[0])[0] != [9]
    assert sampler.sample(logits, [plain], slots=[0])[0] == [9]


def test_slot_table_reuses_the_lowest_free_slot():
    table = SlotTable()
    seqs = [Sequence(f"r{i}", 0, [1], SamplingParams(), 0, 0.0, 0) for i in range(4)]
    assert [table.acquire(s) for s in seqs[:3]] == [0, 1, 2]
    assert table.acquire(seqs[1]) == 1  # already holds one
    table.release(seqs[1])
    table.release(seqs[0])
    assert seqs[0].slot is None and table.num_in_use == 1
    assert table.acquire(seqs[3]) == 0 and table.num_slots == 3
