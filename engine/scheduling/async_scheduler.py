"""The scheduler's part in async scheduling (vLLM V1's AsyncScheduler, in small).

With a decode step launched and its tokens still on the device, AsyncDecode
(engine/runner/async_decode.py) launches the step after it, fed by those tokens, only when
`schedule` would have chosen exactly that batch: nothing waiting or swapped out, every
running sequence in the step, no row with a grammar (its allowed tokens follow the host's
matcher), the token budget and a free block for each row's next position. Then
`schedule_ahead` gives the rows their blocks and counts the step, as `schedule` would
have. A step in flight that read back non-finite is computed again (`rerunning`): the
tokens `advance` counted for it are uncounted meanwhile, since the runner reads the counts.
The engine always runs this scheduler: async scheduling can be switched at run time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..request.sequence import Sequence, SequenceStatus
from ..sampling.greedy import can_launch_ahead
from .scheduler import Scheduler
from .scheduler_output import ScheduledSeq


class AsyncScheduler(Scheduler):
    def schedule_ahead(
        self, prev: list[ScheduledSeq], max_model_len: int
    ) -> tuple[list[ScheduledSeq], list[int]] | None:
        """The decode step after `prev` (launched, its tokens not read yet) when `schedule`
        would choose exactly that batch: its rows, with their blocks, and their positions in
        prev. None, with nothing changed, when it might choose otherwise."""
        if self.waiting or self.swapped:
            return None
        found = continuation_rows(prev, self.running, max_model_len)
        if found is None or len(found[0]) > self.config.max_num_batched_tokens:
            return None
        bm = self.block_manager
        rows = found[0]
        if sum(bm.num_new_blocks(r.seq, r.seq.num_computed_tokens + 1) for r in rows) > bm.pool.num_free_blocks:
            return None  # schedule would preempt: let it
        for r in rows:
            bm.append_slots(r.seq, r.seq.num_computed_tokens + 1)
        self.step_count += 1  # a step planned here instead of by schedule
        return found

    @contextlib.contextmanager
    def rerunning(self, batch: list[ScheduledSeq]) -> Iterator[list[ScheduledSeq]]:
        """The batch's running rows, their tokens counted as not computed while a rerun
        computes them again; counted again after, whatever happens."""
        rows = [item for item in batch if item.seq.status is SequenceStatus.RUNNING]
        for item in rows:
            item.seq.num_computed_tokens -= item.num_tokens
        try:
            yield rows
        finally:
            for item in rows:
                item.seq.num_computed_tokens += item.num_tokens


def continuation_rows(
    prev: list[ScheduledSeq], running: list[Sequence], max_model_len: int
) -> tuple[list[ScheduledSeq], list[int]] | None:
    """The rows of the decode step after `prev` and their positions in it, or None when the
    scheduler might choose otherwise. Sequences that finish by length with prev's token
    are left out."""
    live = [item for item in prev if item.seq.status is SequenceStatus.RUNNING]
    if len(live) != len(running) or {id(i.seq) for i in live} != {id(s) for s in running}:
        return None
    rows, index = [], []
    for i, item in enumerate(prev):
        seq = item.seq
        if seq.status is not SequenceStatus.RUNNING:
            continue
        if seq.num_output_tokens + 1 >= seq.params.max_tokens or seq.num_tokens + 1 >= max_model_len:
            continue  # prev's token is its last
        if not can_launch_ahead(seq):
            return None
        rows.append(ScheduledSeq(seq, 1))
        index.append(i)
    return (rows, index) if rows else None
