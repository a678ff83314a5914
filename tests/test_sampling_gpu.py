"""The device sampler on a CUDA GPU (marker `gpu`; skipped, with the reason, elsewhere):
a step launched ahead draws without one host synchronisation, seeded rows repeat and
do not depend on their batch, and the frequencies match the filtered softmax.

    pytest -m gpu tests/test_sampling_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inferd.engine.request.sampling_params import SamplingParams
from inferd.engine.request.sequence import Sequence
from inferd.engine.sampling.sampler import Sampler

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False"),
]

VOCAB = 128256  # llama-3's: the real row width
EOS = [1]


def _seqs(specs: list[dict]) -> list[Sequence]:
    seqs = []
    for i, spec in enumerate(specs):
        seq = Sequence(f"r{i}", 0, [2, 3], SamplingParams(max_tokens=64, **spec), 0, 0.0, 0)
        seq.slot = i
        seqs.append(seq)
    return seqs


def test_a_drawn_step_has_no_host_synchronisation():
    device = torch.device("cuda")
    specs = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7, top_p=0.9, top_k=50, min_p=0.05)]
    specs += [dict(temperature=0.8, top_p=0.95, seed=5)] * 5
    seqs = _seqs(specs)
    sampler = Sampler(device, VOCAB, EOS)
    logits = torch.randn(len(seqs), VOCAB, device=device)
    sampler.draw_ahead(logits, seqs, pending=0)  # admits the rows (copies at admission are allowed)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens = sampler.draw_ahead(logits, seqs, pending=1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert tokens.shape == (len(seqs),) and tokens.device.type == "cuda"
    assert int(tokens[0]) == int(logits[0].argmax())


@pytest.mark.parametrize("top_k", [0, 40])  # top-p over the whole row; within the top-k
def test_seeded_rows_repeat_and_ignore_their_batch_on_the_gpu(top_k):
    """48 seeded rows (top_p from 0.5 to 0.99), each alone and in batches of 8 and 64 beside
    other rows: the same token every time. A float32 sum whose order followed the batch
    would move some row's top-p set (its mass lies within rounding of p for a few in 48)."""
    device = torch.device("cuda")
    g = torch.Generator(device).manual_seed(12)
    logits = torch.randn(64, VOCAB, device=device, generator=g) * 1.5
    seeded = [dict(temperature=1.0, top_p=0.5 + 0.01 * i, top_k=top_k, seed=i) for i in range(48)]
    others = [dict(temperature=1.0), dict(temperature=0.5, top_k=5, top_p=0.8)] * 8
    batch = _seqs(seeded + others)
    in_64 = Sampler(device, VOCAB, EOS, seed=0).sample(logits, batch)[0][:48]
    in_8, alone = [], []
    for start in range(0, 48, 6):
        rows = list(range(start, start + 6)) + [48, 49]
        in_8 += Sampler(device, VOCAB, EOS, seed=1).sample(
            logits[rows], _seqs([seeded[r] for r in rows[:6]] + others[:2])
        )[0][:6]
    for i in range(48):
        alone += Sampler(device, VOCAB, EOS, seed=9).sample(logits[i : i + 1].clone(), _seqs([seeded[i]]))[0]
    assert in_64 == in_8 == alone
    assert len(set(alone)) > 40


def test_gpu_frequencies_match_the_filtered_softmax():
    from scipy.stats import chisquare

    device = torch.device("cuda")
    vocab, draws = 64, 20000
    row = torch.randn(vocab, generator=torch.Generator().manual_seed(7)) * 1.5
    seq = Sequence("r", 0, [2], SamplingParams(temperature=0.8, top_k=20, top_p=0.9), 0, 0.0, 0)
    sampler = Sampler(device, vocab, EOS)
    tokens, _ = sampler.sample(row.to(device).expand(draws, vocab), [seq] * draws, slots=list(range(draws)))
    x = row.double() / 0.8
    order = torch.argsort(x, descending=True)
    keep = torch.zeros(vocab, dtype=torch.bool)
    keep[order[:20]] = True
    probs = torch.softmax(x.masked_fill(~keep, float("-inf")), dim=-1)
    before = probs[order].cumsum(0) - probs[order]
    keep[order[before >= 0.9]] = False
    expected = torch.softmax(x.masked_fill(~keep, float("-inf")), dim=-1).numpy()
    counts = np.bincount(tokens, minlength=vocab)
    assert counts[expected == 0].sum() == 0
    big = expected * draws >= 5
    observed = np.append(counts[big], counts[~big].sum())
    wanted = np.append(expected[big] * draws, expected[~big].sum() * draws)
    assert chisquare(observed[wanted > 0], wanted[wanted > 0]).pvalue > 1e-3


def test_the_triton_kernels_draw_what_the_torch_path_draws(monkeypatch):
    """engine/sampling/triton_draw.py against the torch code it replaces on CUDA, one process
    switching with INFERD_TRITON_SAMPLING: the same tokens but for near-ties (the kernel's
    -log may differ in its last ulp; its float32 sums run in another order)."""
    from inferd.engine.sampling import triton_draw

    if not triton_draw.HAS_TRITON:
        pytest.skip("needs triton")
    device = torch.device("cuda")
    specs = [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9, top_k=50), dict(temperature=1.0, top_p=0.9)]
    specs += [dict(temperature=0.9, top_p=0.95, min_p=0.02, seed=3), dict(temperature=1.2, seed=4)]
    seqs = _seqs(specs * 13)
    logits = torch.randn(len(seqs), VOCAB, device=device, generator=torch.Generator(device).manual_seed(5)) * 4.0
    drawn = {}
    for switch in ("0", "1"):
        monkeypatch.setenv(triton_draw.ENV_SWITCH, switch)
        assert triton_draw.is_enabled(device) == (switch == "1")
        drawn[switch] = Sampler(device, VOCAB, EOS, seed=7).sample(logits, seqs)[0]
    same = sum(a == b for a, b in zip(drawn["0"], drawn["1"]))
    assert same >= len(seqs) - 2, f"{len(seqs) - same} of {len(seqs)} rows differ"
