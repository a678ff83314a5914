"""Log-probabilities of a prompt's own tokens (vLLM's `prompt_logprobs`, OpenAI's `echo`).

The logits at position p predict token p + 1, so a prefill chunk over positions
[start, start + n) scores the prompt tokens start + 1 .. start + n that are still in
the prompt; the first prompt token has no logprob (None, as vLLM and OpenAI give it).

The runner asks the model for the logits of those rows together with its sampling rows,
in the same `compute_logits` call (so the tensor-parallel runner and its workers need
nothing new), and reduces them on the device to what the request asked for: each
prompt token's log-probability and rank and the top-k (k <= 20) of its position. Only
those small tensors reach the host, never a vocabulary row. The cost on the device is the
logits of the scored rows, [rows, vocab] float32 for a moment, at most the step's token
budget (max_num_batched_tokens) of rows; the reduction works through them in slices of
ROWS_PER_SLICE so that its own copies stay small. Chunked prefill scores each
chunk as it runs; the entries are written by position, so a recompute after preemption
overwrites them with the same values.

Prefix cache: cached prompt blocks have no logits. A request that asks for prompt
logprobs does not take prefix-cache hits (block_manager: its whole prompt is computed
again; its full blocks still enter the cache for other requests). Keeping the logprobs
of every cached block would cost memory for all requests to serve the few that ask.

A pure decode step never scores a prompt token (its row is the newest sampled token),
so the decode graphs and async decode, which run only pure decode steps, need nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..scheduling.scheduler import ScheduledSeq

# Rows reduced at once: bounds the float32 log-softmax copy a long chunk would make.
ROWS_PER_SLICE = 512


@dataclass(slots=True)
class Logprob:
    """One token's log-probability at a prompt position, as vLLM's Logprob."""

    logprob: float
    rank: int
    decoded_token: str | None = None


PromptLogprobs = list[dict[int, Logprob] | None]
"""Per prompt token: None for the first, then {token id: Logprob}, the prompt's own token
first, then the top-k of that position (the prompt token once when it is among them)."""


@dataclass(slots=True)
class PromptLogprobRows:
    """Which rows of a step's flattened tokens score which prompt tokens."""

    rows: list[int]  # row in the step's token order
    target_ids: list[int]  # the prompt token that row predicts
    # per batch item that scores something: (batch index, prompt index of its first scored token, count, top-k)
    items: list[tuple[int, int, int, int]]


@dataclass(frozen=True, slots=True)
class PromptLogprobsChunk:
    """The scores of one batch item's chunk: prompt tokens first_index .. first_index + len - 1."""

    first_index: int
    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]

    def entries(self) -> list[dict[int, Logprob]]:
        out = []
        for j, token in enumerate(self.token_ids):
            entry = {token: Logprob(self.logprobs[j], self.ranks[j])}
            for rank, (tid, lp) in enumerate(zip(self.top_ids[j], self.top_logprobs[j]), start=1):
                if tid not in entry:
                    entry[tid] = Logprob(lp, rank)
            out.append(entry)
        return out


def plan_rows(batch: list[ScheduledSeq], query_start: list[int]) -> PromptLogprobRows | None:
    """The rows of this step that score prompt tokens; None when no item asks."""
    plan: PromptLogprobRows | None = None
    for i, item in enumerate(batch):
        seq = item.seq
        k = seq.params.prompt_logprobs
        if k is None:
            continue
        start = seq.num_computed_tokens
        count = min(item.num_tokens, seq.num_prompt_tokens - 1 - start)
        if count <= 0:
            continue
        if plan is None:
            plan = PromptLogprobRows([], [], [])
        first_row = query_start[i]
        plan.rows.extend(range(first_row, first_row + count))
        plan.target_ids.extend(seq.prompt_token_ids[start + 1 : start + 1 + count])
        plan.items.append((i, start + 1, count, k))
    return plan


def score(logits: torch.Tensor, plan: PromptLogprobRows, batch_size: int) -> list[PromptLogprobsChunk | None]:
    """Reduce the plan's logits rows ([len(plan.rows), vocab], in plan order) on their
    device; one chunk per batch item (None where it scores nothing)."""
    k = max(item[3] for item in plan.items)
    targets = torch.tensor(plan.target_ids, dtype=torch.long).to(logits.device, non_blocking=True)
    chosen, ranks, top_values, top_ids = [], [], [], []
    for lo in range(0, logits.shape[0], ROWS_PER_SLICE):
        lp = torch.log_softmax(logits[lo : lo + ROWS_PER_SLICE].float(), dim=-1)
        picked = lp.gather(1, targets[lo : lo + ROWS_PER_SLICE, None])
        chosen.append(picked[:, 0])
        ranks.append((lp > picked).sum(dim=-1) + 1)
        if k > 0:
            top = torch.topk(lp, k, dim=-1)
            top_values.append(top.values)
            top_ids.append(top.indices)
    # One transfer of the small results (rows x (2 + 2k) numbers).
    chosen_list = torch.cat(chosen).tolist()
    rank_list = torch.cat(ranks).tolist()
    values_list = torch.cat(top_values).tolist() if k > 0 else None
    ids_list = torch.cat(top_ids).tolist() if k > 0 else None
    out: list[PromptLogprobsChunk | None] = [None] * batch_size
    offset = 0
    for index, first, count, n in plan.items:
        rows = slice(offset, offset + count)
        empty: list[list] = [[] for _ in range(count)]
        out[index] = PromptLogprobsChunk(
            first,
            plan.target_ids[rows],
            chosen_list[rows],
            rank_list[rows],
            [r[:n] for r in ids_list[rows]] if ids_list is not None else empty,
            [r[:n] for r in values_list[rows]] if values_list is not None else empty,
        )
        offset += count
    return out


def record(store: PromptLogprobs, chunk: PromptLogprobsChunk, decode) -> None:
    """Write a chunk's entries into a request's prompt logprobs, with each token's text
    (`decode(token_id)`)."""
    for j, entry in enumerate(chunk.entries()):
        for tid, lp in entry.items():
            lp.decoded_token = decode(tid)
        store[chunk.first_index + j] = entry
