"""Turns a batch of logits into next tokens, one row per sequence, on the logits' device.

One path for every mix of rows (engine/sampling/): the per-request parameters are
gathered by slot from persistent device tensors (slot_params.py); the logit bias, a
structured-outputs row's grammar mask (engine/structured_outputs/grammar.py), the
min_tokens ban and the penalties are added (penalties.py); greedy rows take the argmax
of those logits, the others draw at their temperature from their top-k/top-p/min-p set
by an exponential-noise argmax (draw.py). Nothing loops over rows on the host and
nothing is read back but the chosen ids, the finiteness flag and any requested
logprobs, in one transfer. Log-probabilities are those of the raw model output (as vLLM
V1 returns them).

Seeded rows draw from noise keyed by (seed + completion index, output position): the
same request gives the same tokens from the same logits, whatever the batch.
"""

from __future__ import annotations

from typing import Any

import torch

from ..request.sampling_params import GREEDY_BELOW_TEMPERATURE, SamplingParams
from ..request.sequence import Sequence
from ..structured_outputs.grammar import TokenMask
from .draw import draw, noise_streams
from .greedy import plain_greedy
from .logprobs import LogprobLayout
from .penalties import add_logit_bias, apply_penalties, ban_until_min_tokens
from .slot_params import SamplingSlots, SlotBatch, as_int64
from .token_readback import unpack_answer

__all__ = ["GREEDY_BELOW_TEMPERATURE", "NonFiniteLogits", "Sampler", "sample", "warm_up"]


class NonFiniteLogits(RuntimeError):
    """The `finite` flag handed to `sample` was false: the tokens drawn are not to be used."""


def _apply_mask(logits: torch.Tensor, mask: TokenMask) -> None:
    import xgrammar as xgr

    xgr.apply_token_bitmask_inplace(logits, mask.bitmask, vocab_size=logits.shape[1], indices=mask.rows)


class Sampler:
    """The engine's sampler: its per-slot parameters and the key of its unseeded draws.
    Rows are identified by slot (engine/scheduling/slot_table.py; the scheduler assigns
    them to running sequences)."""

    def __init__(self, device: torch.device, vocab: int, eos_token_ids: list[int], seed: int = 0):
        self.slots = SamplingSlots(device, vocab, eos_token_ids)
        self.key = as_int64(seed)
        self.num_draws = 0  # the counter of the unseeded rows' noise

    def sample(
        self,
        logits: torch.Tensor,
        seqs: list[Sequence],
        finite: torch.Tensor | None = None,
        mask: TokenMask | None = None,
        slots: list[int] | None = None,
    ) -> tuple[list[int], list[dict[int, float] | None]]:
        """Next token per row. `finite`: a 0-d bool tensor computed on the device (are the
        logits finite?), read with the tokens; when false, NonFiniteLogits is raised
        instead of returning. `mask`: the allowed tokens of the structured-outputs rows.
        `slots`: the rows' slots (default: each sequence's own)."""
        if mask is None and all(map(plain_greedy, seqs)):
            # the argmax of the logits as they are: widening to float32 keeps their order
            return _read(logits.argmax(dim=-1), finite, None)[0], [None] * len(seqs)
        raw = logits.float()
        if raw.shape[1] != self.slots.vocab:
            raise ValueError(f"logits have {raw.shape[1]} columns, the sampler's vocabulary {self.slots.vocab}")
        if slots is None:
            slots = [_slot_of(s) for s in seqs]
        batch = self.slots.gather(seqs, slots)
        tokens = self._choose(raw, batch, mask)
        return _read(tokens, finite, _logprob_tensors(raw, tokens, batch))

    def draw_ahead(self, logits: torch.Tensor, seqs: list[Sequence], pending: int) -> torch.Tensor:
        """[B] int64 tokens on the device, then the logprobs of the rows asking for them
        (sampling/logprobs.py, LogprobLayout.of the rows' `logprobs`), read nothing: for a
        step launched ahead of the host (engine/runner/async_decode.py), whose rows need no grammar
        (sampling/greedy.py can_launch_ahead), with `pending` tokens not appended yet."""
        raw = logits.float()
        batch = self.slots.gather(seqs, [_slot_of(s) for s in seqs], pending)
        tokens = self._choose(raw, batch, None)
        logprobs = _logprob_tensors(raw, tokens, batch)
        return tokens if logprobs is None else torch.cat([tokens, logprobs[1]])

    def _choose(self, raw: torch.Tensor, batch: SlotBatch, mask: TokenMask | None) -> torch.Tensor:
        """[B] tokens on the device: the logit bias, the grammar mask, the min_tokens ban and
        the penalties added to a copy of the logits, then the argmax of greedy rows and the
        draw of the others. The chosen tokens enter the penalty rows' counts."""
        adjusted = raw
        if batch.any_bias or mask is not None or batch.any_ban or batch.any_penalty:
            adjusted = raw.clone()
            add_logit_bias(adjusted, self.slots, batch)
            if mask is not None:
                _apply_mask(adjusted, mask)
            ban_until_min_tokens(adjusted, self.slots, batch)
            adjusted = apply_penalties(adjusted, self.slots, batch)
        if batch.is_greedy.all():
            tokens = adjusted.argmax(dim=-1)
        else:
            self.num_draws += 1
            tokens = draw(adjusted, batch, noise_streams(batch, self.key, self.num_draws))
        self.slots.count_drawn(batch, tokens)
        return tokens


def _slot_of(seq: Sequence) -> int:
    if seq.slot is None:
        raise ValueError(f"{seq!r} has no slot: only running sequences sample")
    return seq.slot


def _logprob_tensors(
    raw: torch.Tensor, tokens: torch.Tensor, batch: SlotBatch
) -> tuple[LogprobLayout, torch.Tensor] | None:
    """The rows' requested logprobs: their layout and their int64 block on the device."""
    layout = LogprobLayout.of(batch.logprobs)
    return None if layout is None else (layout, layout.pack(raw, tokens))


def _read(
    tokens: torch.Tensor, finite: torch.Tensor | None, logprobs: tuple[LogprobLayout, torch.Tensor] | None
) -> tuple[list[int], list[dict[int, float] | None]]:
    """Token ids (and any logprobs) to the host in one transfer; a device-side finiteness
    flag rides on it, packed as a step launched ahead packs its answer (token_readback.py)."""
    if finite is None and logprobs is None:
        return tokens.tolist(), [None] * tokens.shape[0]
    if finite is None:
        flag = torch.ones(1, dtype=torch.int64, device=tokens.device)
    else:
        flag = finite.view(1).to(torch.int64)
    parts = [flag, tokens] if logprobs is None else [flag, tokens, logprobs[1]]
    layout = None if logprobs is None else logprobs[0]
    ids, ok, out = unpack_answer(torch.cat(parts).cpu(), tokens.shape[0], layout)
    if not ok:
        raise NonFiniteLogits("non-finite logits")
    return ids, out


def sample(
    logits: torch.Tensor,
    seqs: list[Sequence],
    eos_token_ids: list[int],
    seed: int = 0,
    finite: torch.Tensor | None = None,
    mask: TokenMask | None = None,
) -> tuple[list[int], list[dict[int, float] | None]]:
    """One batch through a sampler of its own (rows in slots 0..B-1): for tests and tools;
    the engine keeps one Sampler. `seed` keys the unseeded rows' noise."""
    sampler = Sampler(logits.device, logits.shape[1], eos_token_ids, seed)
    return sampler.sample(logits, seqs, finite=finite, mask=mask, slots=list(range(len(seqs))))


# One row per branch of the sampler: top-k, top-p and min-p with logprobs; penalties, a logit
# bias and a seeded draw; a greedy row banning EOS before min_tokens. Then the first and the
# last alone, for top-p within top-k.
WARMUP_PARAMS: tuple[dict[str, Any], ...] = (
    dict(temperature=0.8, top_p=0.9, top_k=50, min_p=0.05, logprobs=2),
    dict(
        temperature=1.0,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias={0: 1.0},
        seed=0,
    ),
    dict(temperature=0.0, min_tokens=1, logprobs=0),
)


def warm_up(device: torch.device, vocab_size: int, eos_token_ids: list[int]) -> None:
    """Run the sampler once over rows that take each of its branches, on throwaway logits
    with a throwaway sampler. On CUDA a kernel's module loads on its first launch, which
    took up to 93 ms for a kernel of the prefill path on the H200
    (engine/fast_path/warmup.py): the first sampled request should not pay that."""
    seqs = [
        Sequence(f"sampler-warmup-{i}", 0, [1, 2, 3], SamplingParams(max_tokens=1, **params), 0, 0.0, 0)
        for i, params in enumerate(WARMUP_PARAMS)
    ]
    sample(torch.zeros(len(seqs), vocab_size, device=device), seqs, eos_token_ids)
    # every drawing row with a top-k: top-p within the k largest (sampling/draw.py)
    sample(torch.zeros(2, vocab_size, device=device), [seqs[0], seqs[2]], eos_token_ids)
