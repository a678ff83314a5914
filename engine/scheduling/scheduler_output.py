"""What the scheduler hands out for one step (vLLM's SchedulerOutput, in small): the batch
for the runner and the KV swaps for the cache, as plain data."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..kv.block_pool import BlockCopy
from ..request.sequence import Sequence


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_tokens: int  # tokens computed this step

    @property
    def completes(self) -> bool:
        """True when this step computes the sequence's last known token (so it samples)."""
        return self.seq.num_computed_tokens + self.num_tokens == self.seq.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    swap_out: list[BlockCopy] = field(default_factory=list)  # (device, host) (kind, page, slot)
    swap_in: list[BlockCopy] = field(default_factory=list)  # (host, device)
    preempted: list[Sequence] = field(default_factory=list)
    num_swapped_in: int = 0
    num_recompute_faults: int = 0
    num_seat_preemptions: int = 0  # of `preempted`: to seat waiting deadline requests

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
