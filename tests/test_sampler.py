"""The device sampler against the per-row reference it replaced.

`reference_sample` is the engine's former sampler, row by row on the host, with a full
sort for top-k and top-p. Greedy rows and logprobs must agree with it exactly; a sampled
row must be the exponential-noise argmax of the reference's probabilities with the
sampler's own noise (so the filters agree token for token), and its frequencies must
match the exact filtered softmax (chi-square tests in tests/test_sampling_distribution.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from inferd.engine.request.sampling_params import SamplingParams
from inferd.engine.request.sequence import Sequence
from inferd.engine.sampling import noise
from inferd.engine.sampling.sampler import GREEDY_BELOW_TEMPERATURE, Sampler, sample

VOCAB = 97
EOS = [3]


# --- the per-row reference (the sampler before it was batched) ------------------------
def _ref_penalties(logits, seq):
    p = seq.params
    if p.repetition_penalty != 1.0:
        ids = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long)
        vals = logits[ids]
        logits[ids] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and seq.token_counts:
        ids = torch.tensor(list(seq.token_counts), dtype=torch.long)
        counts = torch.tensor(list(seq.token_counts.values()), dtype=logits.dtype)
        logits[ids] -= p.frequency_penalty * counts + p.presence_penalty
    return logits


def _ref_filter(logits, seq):
    p = seq.params
    if p.top_k > 0 and p.top_k < logits.numel():
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        cumulative = sorted_probs.cumsum(0)
        drop_sorted = cumulative - sorted_probs > p.top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
    if p.min_p > 0.0:
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return logits


def _ref_prepare(row, seq, eos_token_ids):
    p = seq.params
    row = row.clone()
    if seq.num_output_tokens < p.min_tokens:
        banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))
        if banned:
            row[torch.tensor(banned, dtype=torch.long)] = float("-inf")
    return _ref_penalties(row, seq)


def reference_stream(seq):
    """A seeded row's noise stream: (seed + completion index, output position)."""
    key = torch.tensor([seq.params.seed + seq.index])
    return noise.row_streams(key, torch.tensor([seq.num_output_tokens]))


def reference_probs(row, seq, eos_token_ids=EOS):
    """The distribution the reference draws a non-greedy row from."""
    row = _ref_filter(_ref_prepare(row.float(), seq, eos_token_ids) / seq.params.temperature, seq)
    return torch.softmax(row, dim=-1)


def reference_sample(logits, seqs, eos_token_ids):
    logits = logits.float().cpu()
    tokens, logprobs = [], []
    for raw, seq in zip(logits, seqs):
        p = seq.params
        row = _ref_prepare(raw, seq, eos_token_ids)
        if p.temperature < GREEDY_BELOW_TEMPERATURE:
            token = int(row.argmax())
        else:
            probs = torch.softmax(_ref_filter(row / p.temperature, seq), dim=-1)
            if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0.0:
                token = int(torch.nan_to_num(row, nan=float("-inf")).argmax())
            else:
                token = int((probs / noise.exponential(reference_stream(seq), VOCAB)[0]).argmax())
        tokens.append(token)
        if p.logprobs is not None:
            lp = torch.log_softmax(raw, dim=-1)
            top = torch.topk(lp, p.logprobs) if p.logprobs > 0 else None
            entry = {} if top is None else {int(i): float(v) for v, i in zip(top.values, top.indices)}
            entry.setdefault(token, float(lp[token]))
            logprobs.append(entry)
        else:
            logprobs.append(None)
    return tokens, logprobs


# --- helpers ----------------------------------------------------------------------------
PARAM_GRID = [
    dict(temperature=0.0),
    dict(temperature=0.0, repetition_penalty=1.3, logprobs=2),
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.9, min_p=0.05),
    dict(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02, repetition_penalty=1.2),
    dict(temperature=1.0, presence_penalty=0.5, frequency_penalty=0.7, logprobs=0),
    dict(temperature=1.1, top_k=VOCAB + 5, repetition_penalty=0.8, logprobs=5),
    dict(temperature=0.5, min_tokens=4, stop_token_ids=[7, 9], top_p=0.95),
    dict(temperature=1.0, min_tokens=4, ignore_eos=True, stop_token_ids=[11]),
    dict(temperature=2e-6, top_k=3),  # above the greedy threshold: divides by a tiny temperature
]


def make_seqs(specs, rng: torch.Generator, seed_base: int | None = 100) -> list[Sequence]:
    seqs = []
    for i, spec in enumerate(specs):
        seed = None if seed_base is None else seed_base + i
        params = SamplingParams(max_tokens=64, seed=seed, **spec)
        prompt = torch.randint(0, VOCAB, (int(torch.randint(1, 12, (1,), generator=rng)),), generator=rng).tolist()
        seq = Sequence(f"r{i}", 0, prompt, params, 0, 0.0, 0)
        for t in torch.randint(0, VOCAB, (int(torch.randint(0, 8, (1,), generator=rng)),), generator=rng).tolist():
            seq.append_token(t)
        seqs.append(seq)
    return seqs


def random_logits(num_rows: int, rng: torch.Generator) -> torch.Tensor:
    logits = torch.randn(num_rows, VOCAB, generator=rng) * 3
    logits[:, ::13] += 4  # some near-ties and peaked rows
    return logits


# --- exact agreement ----------------------------------------------------------------------
@pytest.mark.parametrize("trial", range(6))
def test_seeded_and_greedy_rows_match_the_reference_exactly(trial):
    """Every row seeded: the reference draws argmax(probs / E) with the sampler's noise
    from its sorted filters, so each token, greedy or sampled, and each logprob agree."""
    rng = torch.Generator().manual_seed(trial)
    specs = [PARAM_GRID[int(i)] for i in torch.randint(0, len(PARAM_GRID), (24,), generator=rng)]
    logits = random_logits(24, rng)
    ours = make_seqs(specs, torch.Generator().manual_seed(trial))
    theirs = make_seqs(specs, torch.Generator().manual_seed(trial))
    sampler = Sampler(logits.device, VOCAB, EOS, seed=trial)
    for _ in range(5):  # several steps: the penalty counts advance on the device
        got = sampler.sample(logits, ours, slots=list(range(len(ours))))
        want = reference_sample(logits, theirs, EOS)
        assert got == want
        for seqs in (ours, theirs):
            for seq, token in zip(seqs, got[0]):
                seq.append_token(token)


def test_plain_greedy_batch_is_the_argmax():
    rng = torch.Generator().manual_seed(1)
    logits = random_logits(16, rng)
    seqs = make_seqs([dict(temperature=0.0)] * 16, rng, seed_base=None)
    tokens, logprobs = sample(logits, seqs, EOS)
    assert tokens == logits.argmax(dim=-1).tolist() and logprobs == [None] * 16


def test_one_threshold_decides_greedy_everywhere():
    """Below 1e-5 a row is greedy for the sampler, the greedy head and launch-ahead alike;
    at 1e-5 it samples, dividing by its temperature (no clamp to 0.01 on the way)."""
    from inferd.engine.fast_path.gpu_sampling import plain_greedy as fast_path_greedy
    from inferd.engine.sampling.greedy import plain_greedy

    assert fast_path_greedy is plain_greedy
    tiny, small = make_seqs([dict(temperature=9e-6), dict(temperature=GREEDY_BELOW_TEMPERATURE)], torch.Generator())
    assert tiny.params.is_greedy and plain_greedy(tiny)
    assert not small.params.is_greedy and not plain_greedy(small)


def test_a_seeded_row_does_not_depend_on_its_batch():
    rng = torch.Generator().manual_seed(2)
    spec = dict(temperature=1.0, top_p=0.9)
    alone = make_seqs([spec], torch.Generator().manual_seed(5))
    batched = make_seqs([spec], torch.Generator().manual_seed(5))
    others = make_seqs([dict(temperature=1.0)] * 7 + [dict(temperature=0.0, logprobs=1)], rng, seed_base=None)
    solo, mixed = Sampler(torch.device("cpu"), VOCAB, EOS, seed=0), Sampler(torch.device("cpu"), VOCAB, EOS, seed=9)
    drawn = []
    for _ in range(30):
        row = random_logits(1, rng)
        batch = torch.cat([random_logits(4, rng), row, random_logits(4, rng)])
        token_alone = solo.sample(row, alone, slots=[3])[0][0]
        tokens = mixed.sample(batch, others[:4] + batched + others[4:], slots=[8, 1, 2, 0, 5, 4, 6, 7, 3])[0]
        assert tokens[4] == token_alone
        drawn.append(token_alone)
        alone[0].append_token(token_alone)
        batched[0].append_token(token_alone)
    assert len(set(drawn)) > 5  # it does sample


def test_unseeded_rows_differ_between_draws_and_rows():
    logits = torch.zeros(8, VOCAB)
    seqs = make_seqs([dict(temperature=1.0)] * 8, torch.Generator(), seed_base=None)
    sampler = Sampler(torch.device("cpu"), VOCAB, EOS, seed=0)
    first = sampler.sample(logits, seqs, slots=list(range(8)))[0]
    second = sampler.sample(logits, seqs, slots=list(range(8)))[0]
    assert len(set(first)) > 4 and first != second


def test_an_overflowing_row_degrades_to_greedy_alone():
    rng = torch.Generator().manual_seed(3)
    logits = random_logits(3, rng)
    logits[1] = float("-inf")  # every token banned: no distribution to draw from
    logits[1, 42] = float("nan")
    seqs = make_seqs([dict(temperature=1.0)] * 3, rng)
    want = reference_sample(logits, make_seqs([dict(temperature=1.0)] * 3, torch.Generator().manual_seed(3)), EOS)
    got = sample(logits, seqs, EOS)
    assert got[0][1] == want[0][1] == 0
    assert all(0 <= t < VOCAB for t in got[0])


def test_min_tokens_bans_stop_and_eos_until_reached():
    logits = torch.full((2, VOCAB), -5.0)
    logits[:, 7] = 10.0  # a stop token
    logits[:, EOS[0]] = 9.0
    seqs = make_seqs([dict(temperature=0.0, min_tokens=50, stop_token_ids=[7])] * 2, torch.Generator())
    seqs[1].params = SamplingParams(temperature=0.0, max_tokens=64, min_tokens=0, stop_token_ids=[7])
    tokens, _ = sample(logits, seqs, EOS)
    assert tokens[0] not in (7, EOS[0]) and tokens[1] == 7


# --- distributions --------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [s for s in PARAM_GRID if s["temperature"] >= GREEDY_BELOW_TEMPERATURE])
def test_unseeded_rows_follow_the_reference_distribution(spec):
    """Many copies of one row, drawn in one batch from the shared generator: the
    histogram must match the reference's probabilities within 5 standard errors
    (a fixed generator seed makes the test deterministic)."""
    num_rows = 20000
    rng = torch.Generator().manual_seed(4)
    row = random_logits(1, rng)
    seq = make_seqs([spec], rng, seed_base=None)[0]
    expected = reference_probs(row[0], seq)
    seqs = [seq] * num_rows
    tokens, _ = sample(row.expand(num_rows, VOCAB), seqs, EOS, seed=11)
    counts = torch.bincount(torch.tensor(tokens), minlength=VOCAB).double() / num_rows
    assert float(counts[expected == 0].sum()) == 0.0, "drew a token the filters removed"
    stderr = torch.sqrt(expected.double() * (1 - expected.double()) / num_rows)
    worst = float(((counts - expected.double()).abs() - 5 * stderr).max())
    assert worst <= 1.0 / num_rows, f"frequencies off the reference distribution by {worst:.4f}"
    assert math.isclose(float(counts.sum()), 1.0)


def test_sampler_warm_up_takes_every_branch(monkeypatch):
    """The start-up warm-up (run on CUDA, where kernels load on first launch) goes through
    the filters, penalties, bias, EOS ban, draw and logprobs."""
    import inferd.engine.sampling.sampler as sampler
    from inferd.engine.sampling import draw, filters

    taken = []
    for module, name in [
        (filters, "top_k_floor"),
        (filters, "top_p_keep"),
        (filters, "top_p_floor_within_top_k"),
        (filters, "min_p_floor"),
        (sampler, "apply_penalties"),
        (sampler, "add_logit_bias"),
        (sampler, "ban_until_min_tokens"),
        (sampler, "draw"),
        (sampler, "_logprob_tensors"),
    ]:
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _n=name, _f=original: (taken.append(_n), _f(*a))[1])
    assert draw.filters is filters
    sampler.warm_up(torch.device("cpu"), 64, [2])
    assert set(taken) == {
        "top_k_floor",
        "top_p_keep",
        "top_p_floor_within_top_k",
        "min_p_floor",
        "apply_penalties",
        "add_logit_bias",
        "ban_until_min_tokens",
        "draw",
        "_logprob_tensors",
    }
