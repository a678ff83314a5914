"""Logprobs of decode steps launched ahead of the host (engine/sampling/logprobs.py,
engine/sampling/token_readback.py): the packed block round-trips through both readers (the
synchronous sampler's one transfer and a launched step's non-blocking copy), a launched
step packs what the synchronous sampler returns, and rows asking for logprobs may
launch ahead while plain greedy still means "no logprobs". On CPU, no kernels.

The engine-level check (a mixed batch launched ahead gives the synchronous engine's
tokens and logprobs) is in tests/test_async_decode.py, which runs the fast decode step.
"""

from __future__ import annotations

import pytest
import torch

from inferd.engine.request.sampling_params import SamplingParams
from inferd.engine.request.sequence import Sequence
from inferd.engine.sampling.greedy import can_launch_ahead, plain_greedy
from inferd.engine.sampling.logprobs import LogprobLayout
from inferd.engine.sampling.sampler import NonFiniteLogits, Sampler, _logprob_tensors, _read
from inferd.engine.sampling.token_readback import TokenReadback
from inferd.engine.structured_outputs.params import StructuredOutputsParams

VOCAB = 64
EOS = [2]
CPU = torch.device("cpu")

# Per row: the logprobs asked for (None: none). Rows without logprobs, N = 0 (the chosen
# token only), N = 20 (the most a request may ask), different N in one batch.
WANTED = [
    [3],
    [0],
    [None, 0, None],
    [2, None, 0, 5],
    [None, 20, 1, None, 0],
    [0, 0, 0],
]


def _seqs(specs: list[dict]) -> list[Sequence]:
    seqs = []
    for i, spec in enumerate(specs):
        seq = Sequence(f"r{i}", 0, [5, 6, 7], SamplingParams(max_tokens=16, **spec), 0, 0.0, 0)
        seq.slot = i
        seqs.append(seq)
    return seqs


def _reference(raw: torch.Tensor, tokens: list[int], wanted: list[int | None]) -> list[dict[int, float] | None]:
    """Row by row: the top N of the row's log_softmax, and its chosen token's."""
    out: list[dict[int, float] | None] = []
    for row, token, n in zip(raw, tokens, wanted):
        if n is None:
            out.append(None)
            continue
        lp = torch.log_softmax(row, dim=-1).tolist()
        top = sorted(range(len(lp)), key=lambda t: -lp[t])[:n]
        entry = {t: lp[t] for t in top}
        entry.setdefault(token, lp[token])
        out.append(entry)
    return out


def _assert_same(
    got: list[dict[int, float] | None], want: list[dict[int, float] | None], tolerance: float = 1e-6
) -> None:
    assert [None if d is None else list(d) for d in got] == [None if d is None else list(d) for d in want]
    for g, w in zip(got, want):
        if w is not None:
            assert g is not None and list(g.values()) == pytest.approx(list(w.values()), abs=tolerance)


@pytest.mark.parametrize("wanted", WANTED)
def test_packed_logprobs_round_trip_through_both_readers(wanted):
    """The chosen tokens are random (mostly outside the top N: the dict gains them), the
    finiteness flag rides along; both readers give the row-by-row reference."""
    gen = torch.Generator().manual_seed(len(wanted))
    raw = torch.randn(len(wanted), VOCAB, generator=gen) * 3
    tokens = torch.randint(0, VOCAB, (len(wanted),), generator=gen)
    want = _reference(raw, tokens.tolist(), wanted)
    layout = LogprobLayout.of(wanted)
    assert layout is not None and layout.size == len(layout.rows) * (1 + 2 * max(n for n in wanted if n is not None))
    block = layout.pack(raw, tokens)
    assert block.dtype == torch.int64 and block.shape == (layout.size,)

    # the synchronous sampler's transfer
    ids, got = _read(tokens, torch.tensor(True), (layout, block))
    assert ids == tokens.tolist()
    _assert_same(got, want)

    # a launched step's copy: flag, tokens, logprobs (a readback sized for tokens only grows)
    readback = TokenReadback(CPU, max_rows=len(wanted))
    pending = readback.start(torch.cat([torch.ones(1, dtype=torch.int64), tokens, block]), layout)
    assert pending.device_tokens.tolist() == tokens.tolist()
    ids, finite, got = pending.wait()
    assert ids == tokens.tolist() and finite
    _assert_same(got, want)


def test_no_row_asks_for_logprobs():
    assert LogprobLayout.of([None, None]) is None
    tokens = torch.tensor([4, 9])
    assert _read(tokens, None, None) == ([4, 9], [None, None])
    pending = TokenReadback(CPU, max_rows=2).start(torch.tensor([1, 4, 9]))
    assert pending.wait() == ([4, 9], True, [None, None])


def test_non_finite_steps_give_no_logprobs():
    raw = torch.randn(2, VOCAB)
    tokens = raw.argmax(dim=-1)
    layout = LogprobLayout.of([1, 0])
    assert layout is not None
    block = layout.pack(raw, tokens)
    with pytest.raises(NonFiniteLogits):
        _read(tokens, torch.tensor(False), (layout, block))
    pending = TokenReadback(CPU, max_rows=2).start(
        torch.cat([torch.zeros(1, dtype=torch.int64), tokens, block]), layout
    )
    _, finite, logprobs = pending.wait()
    assert not finite and logprobs == [None, None]


def test_readback_buffers_grow_and_keep_alternating():
    """A step with logprobs needs more room than a tokens-only buffer: the buffer of its
    turn grows; the other step's answer, still unread, is left alone."""
    readback = TokenReadback(CPU, max_rows=2)
    first = readback.start(torch.tensor([1, 7, 8]))
    raw = torch.randn(2, VOCAB)
    tokens = raw.argmax(dim=-1)
    layout = LogprobLayout.of([5, 20])
    assert layout is not None
    block = layout.pack(raw, tokens)
    second = readback.start(torch.cat([torch.ones(1, dtype=torch.int64), tokens, block]), layout)
    assert first.wait() == ([7, 8], True, [None, None])
    third = readback.start(torch.cat([torch.ones(1, dtype=torch.int64), tokens, block]), layout)
    assert first.host.data_ptr() != third.host.data_ptr()  # the first buffer was too small: replaced
    _assert_same(second.wait()[2], _reference(raw, tokens.tolist(), [5, 20]))
    _assert_same(third.wait()[2], _reference(raw, tokens.tolist(), [5, 20]))


def test_a_launched_draw_packs_what_the_sampler_returns():
    """Sampler.draw_ahead's tokens and packed logprobs, unpacked, equal Sampler.sample's
    answer for a batch of greedy, sampled, seeded and logprob rows (unseeded rows: two
    samplers of the same seed on their first draw)."""
    specs = [
        dict(temperature=0.0, logprobs=3),
        dict(temperature=0.9, top_k=20),
        dict(temperature=0.8, top_p=0.9, seed=5, logprobs=0),
        dict(temperature=0.0),
        dict(temperature=1.1, min_p=0.05, logprobs=4),
        dict(temperature=0.7, seed=1),
    ]
    logits = torch.randn(len(specs), VOCAB, generator=torch.Generator().manual_seed(3)) * 2
    want_tokens, want_logprobs = Sampler(CPU, VOCAB, EOS, seed=9).sample(logits, _seqs(specs))
    seqs = _seqs(specs)
    packed = Sampler(CPU, VOCAB, EOS, seed=9).draw_ahead(logits, seqs, pending=0)
    layout = LogprobLayout.of([s.params.logprobs for s in seqs])
    assert layout is not None and packed.shape == (len(specs) + layout.size,)
    tokens = packed[: len(specs)].tolist()
    assert tokens == want_tokens
    assert layout.unpack(tokens, packed[len(specs) :]) == want_logprobs
    assert sum(lp is not None for lp in want_logprobs) == 3


def test_a_batch_without_logprobs_packs_tokens_only():
    seqs = _seqs([dict(temperature=0.0), dict(temperature=0.9, seed=2)])
    logits = torch.randn(2, VOCAB)
    assert Sampler(CPU, VOCAB, EOS).draw_ahead(logits, seqs, pending=0).shape == (2,)
    assert _logprob_tensors(logits, logits.argmax(dim=-1), Sampler(CPU, VOCAB, EOS).slots.gather(seqs, [0, 1])) is None


def test_every_row_but_a_grammar_row_may_launch_ahead_and_plain_greedy_asks_nothing_more():
    greedy_lp, sampled_lp, greedy = _seqs(
        [dict(temperature=0.0, logprobs=2), dict(temperature=0.8, logprobs=0), dict(temperature=0.0)]
    )
    assert can_launch_ahead(greedy_lp) and can_launch_ahead(sampled_lp) and can_launch_ahead(greedy)
    assert not plain_greedy(greedy_lp) and not plain_greedy(sampled_lp) and plain_greedy(greedy)
    for spec in (
        dict(frequency_penalty=0.5),
        dict(repetition_penalty=1.2),
        dict(logit_bias={3: 1.0}),
        dict(min_tokens=4),
    ):
        seq = _seqs([dict(temperature=0.0, **spec)])[0]
        assert can_launch_ahead(seq) and not plain_greedy(seq)
    grammar = _seqs([dict(temperature=0.0, structured_outputs=StructuredOutputsParams(json={"type": "object"}))])[0]
    assert not can_launch_ahead(grammar) and not plain_greedy(grammar)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False")
def test_a_launched_step_with_logprobs_has_no_host_synchronisation():
    """On the GPU, with llama-3's row width: the draw, the logprobs and the start of their
    copy (through buffers that must grow) read nothing back; the answer read afterwards
    has the raw logits' logprobs."""
    device, vocab = torch.device("cuda"), 128256
    specs = [dict(temperature=0.0, logprobs=5), dict(temperature=1.0), dict(temperature=0.8, seed=3, logprobs=0)]
    specs += [dict(temperature=0.0)] * 3 + [dict(temperature=1.0, top_p=0.9, logprobs=20)]
    seqs = _seqs(specs)
    sampler = Sampler(device, vocab, EOS)
    logits = torch.randn(len(seqs), vocab, device=device) * 3
    sampler.draw_ahead(logits, seqs, pending=0)  # admits the rows (copies at admission are allowed)
    layout = LogprobLayout.of([s.params.logprobs for s in seqs])
    readback = TokenReadback(device, max_rows=len(seqs))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        packed = sampler.draw_ahead(logits, seqs, pending=1)
        pending = readback.start(torch.cat([torch.ones(1, dtype=torch.int64, device=device), packed]), layout)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    tokens, finite, logprobs = pending.wait()
    assert finite and tokens[0] == int(logits[0].argmax())
    # the GPU's log_softmax may differ from the CPU's in the last bits
    _assert_same(logprobs, _reference(logits.cpu(), tokens, [s.params.logprobs for s in seqs]), tolerance=1e-4)
