"""A request and its sequences: each sequence is one completion, with its tokens and KV block table."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any

from ..text.detokenizer import IncrementalDetokenizer
from .prompt_logprobs import PromptLogprobs
from .sampling_params import SamplingParams
from .slo import RequestSlo


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    SWAPPED = auto()
    FINISHED = auto()


@dataclass(slots=True)
class SequenceTimes:
    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None


_seq_ids = itertools.count()


class Sequence:
    """Token ids are prompt + output; the first `num_computed_tokens` have KV in the cache.

    Each step computes tokens [num_computed_tokens, num_tokens): a whole or partial
    prompt chunk, or (decoding) the one token sampled last step. When the step brings
    num_computed_tokens up to num_tokens, a new token is sampled.
    """

    def __init__(
        self,
        request_id: str,
        index: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int,
        arrival_time: float,
        arrival_step: int,
        slo: RequestSlo | None = None,
    ):
        self.seq_id = next(_seq_ids)
        self.request_id = request_id
        self.index = index
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = params
        self.priority = priority
        self.arrival_step = arrival_step
        self.slo = slo  # None or a best-effort class: no deadline
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens the prefix cache held at first admission
        self.block_table: list[int] = []
        self.num_hashed_blocks = 0
        # (hash, tokens) of the leading full blocks, computed once (tokens are only appended)
        self.block_hashes: list[tuple[int, tuple[int, ...]]] = []
        self.num_cold_scanned = 0  # leading blocks already cold (cooling resumes after them)
        self.host_block_table: list[int] = []  # while swapped out
        self.num_preemptions = 0
        self.needs_recompute_fault = False  # counted as a KV page fault when it resumes
        self.blocked_since_step: int | None = None  # the step admission first found no room for it
        self.output_text = ""
        self.detokenizer = IncrementalDetokenizer(params.skip_special_tokens)
        self.logprobs: list[dict[int, float]] = []
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.times = SequenceTimes(arrival=arrival_time)
        # Its row in the sampler's per-slot tables while it runs (the scheduler's SlotTable).
        self.slot: int | None = None
        self.token_counts: dict[int, int] = {}  # output token -> occurrences, for penalties
        self._prompt_id_set: frozenset[int] | None = None  # built on first use by the repetition penalty

    # --- tokens -------------------------------------------------------------
    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def tokens(self, start: int, end: int) -> list[int]:
        """token_ids[start:end] without building the whole list (long prompts, every step)."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        return self.num_uncomputed_tokens > 1 or self.num_output_tokens == 0

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def seen_token_ids(self) -> list[int]:
        """Distinct ids of the prompt and output (the repetition penalty's set)."""
        if self._prompt_id_set is None:
            self._prompt_id_set = frozenset(self.prompt_token_ids)
        return list(self._prompt_id_set.union(self.token_counts))

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.token_counts[token_id] = self.token_counts.get(token_id, 0) + 1

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id}#{self.index}, {self.status.name}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table})"
        )


@dataclass(slots=True)
class Request:
    """A request as the engine holds it: its prompt and its `n` sequences."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    arrival_time: float
    counted_prompt: bool = False
    num_cached_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # Filled by position as prefill chunks score the prompt (engine/request/prompt_logprobs.py);
    # None when params.prompt_logprobs is None.
    prompt_logprobs: PromptLogprobs | None = None

    @property
    def is_finished(self) -> bool:
        for seq in self.seqs:
            if seq.status is not SequenceStatus.FINISHED:
                return False
        return True
