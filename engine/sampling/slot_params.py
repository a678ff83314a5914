"""Per-request sampling parameters in persistent per-slot tensors on the device.

A sequence's row is its slot (scheduling/slot_table.py). The row is filled when a new occupant is
first seen (its admission to the sampler), from a pinned host mirror in one copy of the
whole table; a step then gathers the rows of its batch by slot index on the device: no
parameter tensor is rebuilt from Python lists per step. The per-step inputs are the
batch's slots and output positions, one [2, B] copy, like the model's input ids.

Penalty state (the tokens a sequence has seen, prompt and output, and how often it
emitted each) lives on the device too, [slots, vocab], allocated when the first request
with a penalty arrives. The sampler adds each step's chosen tokens to it on the device
(`count_drawn`); a row whose count of emitted tokens disagrees with its sequence (a
token appended elsewhere, a preemption) is rebuilt from the sequence's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..request.sampling_params import SamplingParams
from ..request.sequence import Sequence

# Rows of the float table and of the int table.
TEMPERATURE, TOP_P, MIN_P, REPETITION, PRESENCE, FREQUENCY = range(6)
TOP_K, SEED_KEY, MIN_TOKENS, IS_GREEDY, IS_SEEDED = range(5)


def _float_row(p: SamplingParams) -> list[float]:
    temperature = 1.0 if p.is_greedy else p.temperature  # greedy rows take the argmax before it
    return [temperature, p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty]


def _needs_penalty(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or bool(p.presence_penalty) or bool(p.frequency_penalty)


def _banned(p: SamplingParams, eos_token_ids: list[int]) -> list[int]:
    """Tokens that cannot end the sequence before min_tokens."""
    if p.min_tokens == 0:
        return []
    return list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))


@dataclass(slots=True)
class SlotBatch:
    """One step's rows: the device tensors gathered by slot, and what the host knows of the
    batch without a device read (which filters and additions any row needs)."""

    slots: torch.Tensor  # [B] int64
    slot_index: np.ndarray  # the same, on the host
    positions: torch.Tensor  # [B] int64: each row's output position (tokens emitted so far)
    floats: torch.Tensor  # [6, B] float32 (TEMPERATURE ...)
    ints: torch.Tensor  # [5, B] int64 (TOP_K ...)
    is_greedy: np.ndarray  # [B] bool, on the host
    max_top_k: int  # 0: no row uses top-k
    top_k_everywhere: bool  # every row that draws (not greedy) has a top-k
    any_top_p: bool
    any_min_p: bool
    any_bias: bool
    any_ban: bool
    any_penalty: bool
    logprobs: list[int | None]  # per row: top-N asked for, or None


class SamplingSlots:
    def __init__(self, device: torch.device, vocab: int, eos_token_ids: list[int]):
        self.device = device
        self.vocab = vocab
        self.eos_token_ids = list(eos_token_ids)
        self.capacity = 0
        self._pin = device.type == "cuda"
        self._step_rows = [torch.zeros(0, dtype=torch.int64) for _ in range(2)]  # pinned, alternating
        self._step_turn = 0
        self._host_floats = torch.zeros(6, 0)
        self._host_ints = torch.zeros(5, 0, dtype=torch.int64)
        self.floats = torch.zeros(6, 0, device=device)
        self.ints = torch.zeros(5, 0, dtype=torch.int64, device=device)
        self._occupant = np.zeros(0, dtype=np.int64)  # seq_id per slot, -1: none
        self._flags = np.zeros((5, 0), dtype=bool)  # greedy, top-p on, min-p on, has bias, has ban
        self._top_k = np.zeros(0, dtype=np.int64)  # 0: off
        self._penalty = np.zeros(0, dtype=bool)
        self._num_counted = np.zeros(0, dtype=np.int64)  # output tokens in the slot's counts
        # Sparse additions: [slots, width] token ids and values (padding: id 0, value 0).
        self.bias_ids = torch.zeros(0, 1, dtype=torch.int64, device=device)
        self.bias_values = torch.zeros(0, 1, device=device)
        self.ban_ids = torch.zeros(0, 1, dtype=torch.int64, device=device)
        self.ban_valid = torch.zeros(0, 1, dtype=torch.bool, device=device)
        self.seen: torch.Tensor | None = None  # [slots, vocab] bool, with the first penalty
        self.counts: torch.Tensor | None = None  # [slots, vocab] int32

    # --- admission ---------------------------------------------------------------
    def gather(self, seqs: list[Sequence], slots: list[int], pending: int = 0) -> SlotBatch:
        """Fill the rows of sequences new to their slot, then the step's rows. `pending`:
        tokens each sequence has drawn but not appended yet (a step launched ahead)."""
        need = max(max(slots) + 1, len(seqs))
        if need > self.capacity:
            self._grow(need)
        slot_index = np.asarray(slots, dtype=np.int64)
        seq_ids = np.fromiter((s.seq_id for s in seqs), dtype=np.int64, count=len(seqs))
        fresh = np.nonzero(self._occupant[slot_index] != seq_ids)[0]
        if len(fresh):
            self._admit([seqs[i] for i in fresh], slot_index[fresh].tolist())
        penalty = self._penalty[slot_index]
        if penalty.any():
            # a step launched ahead has counted `pending` tokens its sequences do not hold yet
            emitted = np.fromiter((s.num_output_tokens + pending for s in seqs), dtype=np.int64, count=len(seqs))
            stale = np.nonzero(penalty & (self._num_counted[slot_index] != emitted))[0]
            if len(stale):
                self._rebuild_penalty_rows([seqs[i] for i in stale], slot_index[stale].tolist())
        # From pinned memory, alternating: a pageable source would make the copy wait for
        # the device's earlier work (a step in flight included).
        host = self._step_rows[self._step_turn][: 2 * len(seqs)].view(2, len(seqs))  # contiguous
        self._step_turn ^= 1
        host[0] = torch.from_numpy(slot_index)
        host[1] = torch.tensor([s.num_output_tokens + pending for s in seqs], dtype=torch.int64)
        steps = host.to(self.device, non_blocking=True)
        flags = self._flags[:, slot_index]
        top_k = self._top_k[slot_index]
        return SlotBatch(
            slots=steps[0],
            slot_index=slot_index,
            positions=steps[1],
            floats=self.floats[:, steps[0]],
            ints=self.ints[:, steps[0]],
            is_greedy=flags[0],
            max_top_k=int(top_k.max()),
            top_k_everywhere=bool(((top_k > 0) | flags[0]).all()),
            any_top_p=bool(flags[1].any()),
            any_min_p=bool(flags[2].any()),
            any_bias=bool(flags[3].any()),
            any_ban=bool(flags[4].any()),
            any_penalty=bool(penalty.any()),
            logprobs=[s.params.logprobs for s in seqs],
        )

    def _admit(self, seqs: list[Sequence], slots: list[int]) -> None:
        bias_rows, ban_rows = [], []
        for seq, slot in zip(seqs, slots):
            p = seq.params
            self._occupant[slot] = seq.seq_id
            self._host_floats[:, slot] = torch.tensor(_float_row(p))
            top_k = p.top_k if 0 < p.top_k < self.vocab else 0
            seed_key = as_int64(p.seed + seq.index) if p.seed is not None else 0
            self._host_ints[:, slot] = torch.tensor([top_k, seed_key, p.min_tokens, p.is_greedy, p.seed is not None])
            bias = {t: v for t, v in (p.logit_bias or {}).items() if t < self.vocab}
            banned = [t for t in _banned(p, self.eos_token_ids) if t < self.vocab]
            self._top_k[slot] = top_k
            self._flags[:, slot] = [p.is_greedy, p.top_p < 1.0, p.min_p > 0.0, bool(bias), bool(banned)]
            self._penalty[slot] = _needs_penalty(p)
            bias_rows.append((slot, list(bias), list(bias.values())))
            ban_rows.append((slot, banned))
        self.floats.copy_(self._host_floats, non_blocking=True)
        self.ints.copy_(self._host_ints, non_blocking=True)
        self._write_sparse(bias_rows, ban_rows)
        penalised = [(s, slot) for s, slot in zip(seqs, slots) if self._penalty[slot]]
        if penalised:
            self._rebuild_penalty_rows([s for s, _ in penalised], [slot for _, slot in penalised])

    def _write_sparse(self, bias_rows: list, ban_rows: list) -> None:
        bias_width = max(len(ids) for _, ids, _ in bias_rows)
        ban_width = max(len(ids) for _, ids in ban_rows)
        if bias_width > self.bias_ids.shape[1]:
            self.bias_ids, self.bias_values = _widen(self.bias_ids, bias_width), _widen(self.bias_values, bias_width)
        if ban_width > self.ban_ids.shape[1]:
            self.ban_ids, self.ban_valid = _widen(self.ban_ids, ban_width), _widen(self.ban_valid, ban_width)
        slots = torch.tensor([slot for slot, _, _ in bias_rows], dtype=torch.int64)
        ids = torch.zeros(len(bias_rows), self.bias_ids.shape[1], dtype=torch.int64)
        values = torch.zeros(len(bias_rows), self.bias_ids.shape[1])
        for i, (_, tokens, bias) in enumerate(bias_rows):
            ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
            values[i, : len(tokens)] = torch.tensor(bias, dtype=torch.float32)
        ban_ids = torch.zeros(len(ban_rows), self.ban_ids.shape[1], dtype=torch.int64)
        ban_valid = torch.zeros(len(ban_rows), self.ban_ids.shape[1], dtype=torch.bool)
        for i, (_, tokens) in enumerate(ban_rows):
            ban_ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
            ban_valid[i, : len(tokens)] = True
        index = slots.to(self.device)
        self.bias_ids[index] = ids.to(self.device)
        self.bias_values[index] = values.to(self.device)
        self.ban_ids[index] = ban_ids.to(self.device)
        self.ban_valid[index] = ban_valid.to(self.device)

    def _rebuild_penalty_rows(self, seqs: list[Sequence], slots: list[int]) -> None:
        """The rows' seen-token and emitted-count tables from their sequences' tokens."""
        if self.seen is None or self.counts is None:
            self.seen = torch.zeros(self.capacity, self.vocab, dtype=torch.bool, device=self.device)
            self.counts = torch.zeros(self.capacity, self.vocab, dtype=torch.int32, device=self.device)
        seen = torch.zeros(len(seqs), self.vocab, dtype=torch.bool)
        counts = torch.zeros(len(seqs), self.vocab, dtype=torch.int32)
        for i, seq in enumerate(seqs):
            seen[i, torch.tensor(seq.seen_token_ids(), dtype=torch.int64)] = True
            if seq.token_counts:
                ids = torch.tensor(list(seq.token_counts), dtype=torch.int64)
                counts[i, ids] = torch.tensor(list(seq.token_counts.values()), dtype=torch.int32)
            self._num_counted[slots[i]] = seq.num_output_tokens
        index = torch.tensor(slots, dtype=torch.int64).to(self.device)
        self.seen[index] = seen.to(self.device)
        self.counts[index] = counts.to(self.device)

    def count_drawn(self, batch: SlotBatch, tokens: torch.Tensor) -> None:
        """Add the step's chosen tokens (on the device) to the penalty rows' state."""
        if not batch.any_penalty or self.seen is None or self.counts is None:
            return
        self.counts.index_put_((batch.slots, tokens), torch.ones_like(tokens, dtype=torch.int32), accumulate=True)
        self.seen[batch.slots, tokens] = True
        self._num_counted[batch.slot_index] += 1

    # --- storage -------------------------------------------------------------------
    def _grow(self, need: int) -> None:
        """Room for `need` slots (doubling): tensors are reallocated, their rows kept."""
        cap = max(need, 2 * self.capacity, 8)
        old = self.capacity
        host_floats = torch.zeros(6, cap, pin_memory=self._pin)
        host_floats[:, :old] = self._host_floats
        host_ints = torch.zeros(5, cap, dtype=torch.int64, pin_memory=self._pin)
        host_ints[:, :old] = self._host_ints
        self._host_floats, self._host_ints = host_floats, host_ints
        self._step_rows = [torch.zeros(2 * cap, dtype=torch.int64, pin_memory=self._pin) for _ in range(2)]
        self.floats = host_floats.to(self.device)
        self.ints = host_ints.to(self.device)
        self._occupant = np.concatenate([self._occupant, np.full(cap - old, -1, dtype=np.int64)])
        self._flags = np.concatenate([self._flags, np.zeros((5, cap - old), dtype=bool)], axis=1)
        self._top_k = np.concatenate([self._top_k, np.zeros(cap - old, dtype=np.int64)])
        self._penalty = np.concatenate([self._penalty, np.zeros(cap - old, dtype=bool)])
        self._num_counted = np.concatenate([self._num_counted, np.zeros(cap - old, dtype=np.int64)])
        self.bias_ids = _extend(self.bias_ids, cap)
        self.bias_values = _extend(self.bias_values, cap)
        self.ban_ids = _extend(self.ban_ids, cap)
        self.ban_valid = _extend(self.ban_valid, cap)
        if self.seen is not None and self.counts is not None:
            self.seen, self.counts = _extend(self.seen, cap), _extend(self.counts, cap)
        self.capacity = cap


def as_int64(value: int) -> int:
    """The int64 with the same low 64 bits (a seed near 2^63 plus its completion's index)."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


def _extend(table: torch.Tensor, rows: int) -> torch.Tensor:
    out = table.new_zeros(rows, *table.shape[1:])
    out[: table.shape[0]] = table
    return out


def _widen(table: torch.Tensor, width: int) -> torch.Tensor:
    width = 1 << (width - 1).bit_length()  # powers of two: few reallocations
    out = table.new_zeros(table.shape[0], width)
    out[:, : table.shape[1]] = table
    return out
