"""Stable slot ids for running sequences: the row of a sequence in the sampler's
per-slot tables (sampling/slot_params.py) for as long as it runs.

The scheduler owns the table: a sequence takes a slot when it starts running (admitted
or swapped in) and gives it back when it stops (preempted, finished or aborted). Free
slots are reused lowest first, so the ids stay below the number of sequences that ever
ran at once (max_num_seqs, unless it was lowered at run time).
"""

from __future__ import annotations

import heapq

from ..request.sequence import Sequence


class SlotTable:
    def __init__(self) -> None:
        self._free: list[int] = []  # a heap: the lowest free id first
        self.num_slots = 0  # ids handed out so far: every slot id is below this

    def acquire(self, seq: Sequence) -> int:
        if seq.slot is None:
            seq.slot = heapq.heappop(self._free) if self._free else self._new_id()
        return seq.slot

    def release(self, seq: Sequence) -> None:
        if seq.slot is not None:
            heapq.heappush(self._free, seq.slot)
            seq.slot = None

    @property
    def num_in_use(self) -> int:
        return self.num_slots - len(self._free)

    def _new_id(self) -> int:
        self.num_slots += 1
        return self.num_slots - 1
