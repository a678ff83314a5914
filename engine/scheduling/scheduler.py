"""Continuous-batching scheduler with chunked prefill, priorities and preemption.

Each step gets a token budget (`max_num_batched_tokens`) and a sequence budget
(`max_num_seqs`), spent in this order:
1. running sequences, most urgent first: a decode token each, or the next chunk of a
   prompt. When a sequence cannot get a block, the least urgent running sequence not
   yet scheduled is preempted (swap, or recompute when swap is off or the host pool is
   full); if none is left, the sequence preempts itself;
2. swapped-out sequences come back (a KV page fault), if nothing was preempted;
3. waiting requests are admitted, most urgent first, while blocks above the
   watermark and the budgets allow. A request that does not fit lets those behind it
   use the room there is until it has waited `priority_aging_steps` steps for room;
   then admission stops behind it, so large requests are not starved by small ones.

The order (priorities, aging, SLO tiers: deadline requests first, best effort keeping its
share of the seats) is engine/scheduling/request_order.py's. Running sequences keep that order when
blocks run out, so a running deadline sequence is never preempted for a best-effort one.
When every seat is taken and a deadline request waits, the least urgent best-effort running sequence is preempted
(recompute) so that it is admitted in that step, as long as best effort keeps its share:
otherwise its first token waits for some best-effort sequence to finish its whole output.
Without deadlines the order is exactly the one above, and nothing is preempted for a seat.

The scheduler owns the state of its sequences and of its BlockManager: nothing else
writes either. Besides `schedule`, it is told what happened to a step: `advance` (the
batch ran: its tokens are computed), `update_from_output` (the sampled tokens), `finish`
(a sequence stopped or was aborted: its blocks are freed). AsyncScheduler
(engine/scheduling/async_scheduler.py) adds the decode step launched ahead of the host. The
configuration is read from its owner (engine/live_config.py) at each use: a run-time
change of the budgets or the preemption mode applies from the next step.
"""

from __future__ import annotations

import time
from collections import deque

from ..config import EngineConfig
from ..kv.block_manager import BlockManager, HostResize
from ..live_config import LiveConfig
from ..request.sequence import Sequence, SequenceStatus
from ..request.slo import best_effort_seats
from .request_order import admission_order, has_deadline, order
from .scheduler_output import ScheduledSeq, SchedulerOutput
from .slot_table import SlotTable
from .ttft_predictor import TtftPredictor

# ScheduledSeq and SchedulerOutput live in scheduler_output.py; the runners and the fast path import them from here.
__all__ = ["ScheduledSeq", "Scheduler", "SchedulerOutput"]


class Scheduler:
    def __init__(
        self,
        config: LiveConfig,
        num_blocks: int,
        num_host_blocks: int,
        slots_per_page: dict[str, int] | None = None,
        predictor: TtftPredictor | None = None,
    ):
        self._config = config
        start = config.current
        # Read by the engine, the runner (its page allocator) and the metrics; changed only here.
        self.block_manager = BlockManager(
            num_blocks, num_host_blocks, start.block_size, start.enable_prefix_caching, start.watermark, slots_per_page
        )
        self.predictor = predictor if predictor is not None else TtftPredictor()
        self.has_deadlines = False  # a sequence with a TTFT deadline was ever added: order by slack too
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.slots = SlotTable()  # a running sequence's row in the sampler's tables
        self.step_count = 0
        self.num_preemptions = 0

    @property
    def config(self) -> EngineConfig:
        """The configuration in force (its owner's current one)."""
        return self._config.current

    # --- queues ---------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if seq.slo is not None and seq.slo.deadline is not None:
            self.has_deadlines = True
        self.waiting.append(seq)

    def finish(self, seq: Sequence, reason: str, now: float, stop_reason: str | int | None = None) -> None:
        """The sequence stopped, reached its length or was aborted: it leaves its queue and
        its blocks and slot are released at once."""
        if seq.status is not SequenceStatus.FINISHED:
            for queue in (self.waiting, self.running, self.swapped):
                if seq in queue:
                    queue.remove(seq)
            if seq.block_table:
                self.block_manager.free(seq)
            if seq.host_block_table:
                self.block_manager.release_host(seq)
            self.slots.release(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        seq.times.finished = now

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def _order(self, seqs: list[Sequence]) -> list[Sequence]:
        predictor = self.predictor if self.has_deadlines else None
        return order(seqs, self.step_count, self.config.priority_aging_steps, predictor)

    @property
    def best_effort_seats(self) -> int:
        """Seats kept for best-effort sequences when deadline requests compete for them."""
        return best_effort_seats(self.config.max_num_seqs, self.config.best_effort_seat_share)

    def _admission_order(self) -> list[Sequence]:
        waiting = self._order(self.waiting)
        return admission_order(waiting, self.running, self.best_effort_seats) if self.has_deadlines else waiting

    @staticmethod
    def _victim(queue: deque[Sequence], seq: Sequence) -> Sequence:
        """The least urgent of `queue` (the running sequences not yet scheduled this step),
        taken out of it; `seq` itself when none is left. With deadlines the order puts every
        deadline sequence before every best-effort one, so a best-effort sequence never
        preempts a deadline one."""
        return queue.pop() if queue else seq

    # --- the step -------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        self.step_count += 1
        out = SchedulerOutput()
        token_budget = self.config.max_num_batched_tokens
        bm = self.block_manager

        block_size = bm.block_size
        queue = deque(self._order(self.running))
        if self.has_deadlines and self.waiting:
            self._seat_deadline_requests(queue, out)
        still_running: list[Sequence] = []
        while queue:
            seq = queue.popleft()
            num = min(seq.num_uncomputed_tokens, token_budget)
            if num == 0:
                still_running.append(seq)
                continue
            target = seq.num_computed_tokens + num
            if target > len(seq.block_table) * block_size:  # else its blocks already hold the tokens
                # A sequence that preempts itself waits for the sequences scheduled before
                # it this step to finish. It cannot do so for ever: validation and the
                # start-up clamp of max_model_len keep every sequence within the blocks
                # one sequence can hold (the pool less its watermark), so once it runs
                # alone it fits, and admission and swap-in let it back.
                while not bm.can_append(seq, target):
                    victim = self._victim(queue, seq)
                    self._preempt(victim, out)
                    if victim is seq:
                        break
                if seq.status is not SequenceStatus.RUNNING:
                    continue
                bm.append_slots(seq, target)
            out.scheduled.append(ScheduledSeq(seq, num))
            still_running.append(seq)
            token_budget -= num
        self.running = still_running

        if len(out.preempted) == out.num_seat_preemptions:  # memory pressure: no swap-in or admission
            self._swap_in(out, token_budget)
            token_budget = self.config.max_num_batched_tokens - out.num_batched_tokens
            if not self.swapped:
                self._admit(out, token_budget)
        self.num_preemptions += len(out.preempted)
        return out

    def _seat_deadline_requests(self, queue: deque[Sequence], out: SchedulerOutput) -> None:
        """When every seat (max_num_seqs) is taken, free one for each waiting deadline request
        by preempting the least urgent best-effort running sequence (recompute: its seat must
        be free this step, and a swapped sequence would hold up admission), as long as best
        effort keeps its seats (`best_effort_seats`). Without this a deadline request waits for
        a best-effort sequence to finish, however long its output."""
        best_effort_running = sum(1 for s in queue if not has_deadline(s))
        seats = self.config.max_num_seqs - len(self.running)
        if any(not has_deadline(s) for s in self.waiting):  # admission gives them their missing seats first
            seats -= max(0, self.best_effort_seats - best_effort_running)
        for seq in self._order(self.waiting):
            if not has_deadline(seq):
                continue  # the rest of the order is best effort
            if seats > 0:
                seats -= 1
                continue
            if best_effort_running <= self.best_effort_seats:
                return
            victim = next((v for v in reversed(queue) if not has_deadline(v)), None)
            if victim is None:
                return
            queue.remove(victim)
            self._preempt(victim, out, recompute=True)
            out.num_seat_preemptions += 1
            best_effort_running -= 1

    def _swap_in(self, out: SchedulerOutput, token_budget: int) -> None:
        bm = self.block_manager
        for seq in self._order(self.swapped):
            if len(self.running) >= self.config.max_num_seqs or token_budget <= 0 or not bm.can_swap_in(seq):
                break
            out.swap_in += bm.swap_in(seq)
            self.swapped.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.slots.acquire(seq)
            self.running.append(seq)
            out.num_swapped_in += 1
            num = min(seq.num_uncomputed_tokens, token_budget)
            if bm.can_append(seq, seq.num_computed_tokens + num):  # else it grows next step
                bm.append_slots(seq, seq.num_computed_tokens + num)
                out.scheduled.append(ScheduledSeq(seq, num))
                token_budget -= num

    def _admit(self, out: SchedulerOutput, token_budget: int) -> None:
        bm = self.block_manager
        for seq in self._admission_order():
            if len(self.running) >= self.config.max_num_seqs or token_budget <= 0:
                break
            if seq.index > 0 and self._first_sibling_prefilling(seq):
                continue  # wait for the prompt's blocks to be cached, then share them
            if not bm.try_allocate(seq, token_budget):
                # No head-of-line blocking: the sequences behind one that does not fit yet may
                # use the room there is, until it has waited priority_aging_steps for room;
                # then admission stops behind it, so the pool drains for it and it cannot starve.
                if seq.blocked_since_step is None:
                    seq.blocked_since_step = self.step_count
                if self.step_count - seq.blocked_since_step >= self.config.priority_aging_steps:
                    break
                continue
            seq.blocked_since_step = None
            num = min(seq.num_uncomputed_tokens, token_budget)
            bm.append_slots(seq, seq.num_computed_tokens + num)
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.slots.acquire(seq)
            self.running.append(seq)
            if seq.times.first_scheduled is None:  # now, not after the step: its prefill is not queue time
                seq.times.first_scheduled = time.time()
                seq.num_cached_tokens = seq.num_computed_tokens  # what the prefix cache gave, as vLLM counts it
            if seq.needs_recompute_fault:
                out.num_recompute_faults += 1
                seq.needs_recompute_fault = False
            out.scheduled.append(ScheduledSeq(seq, num))
            token_budget -= num

    def _first_sibling_prefilling(self, seq: Sequence) -> bool:
        if not self.block_manager.enable_prefix_caching:
            return False
        for other in self.waiting + self.running:
            if other.request_id == seq.request_id and other.index == 0:
                return other.num_output_tokens == 0
        return False

    def _preempt(self, seq: Sequence, out: SchedulerOutput, recompute: bool = False) -> None:
        bm = self.block_manager
        if seq in self.running:
            self.running.remove(seq)
        seq.num_preemptions += 1
        self.slots.release(seq)
        out.preempted.append(seq)
        use_swap = (
            not recompute
            and self.config.preemption_mode == "swap"
            and self.config.swap_space_bytes > 0
            and bm.can_swap_out(seq)
        )
        if use_swap:
            out.swap_out += bm.swap_out(seq)
            seq.status = SequenceStatus.SWAPPED
            self.swapped.append(seq)
        else:
            bm.free(seq)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
            seq.needs_recompute_fault = True
            self.waiting.append(seq)

    # --- after the step ran -----------------------------------------------------
    def advance(self, batch: list[ScheduledSeq]) -> list[Sequence]:
        """The batch ran (or, launched ahead, runs before anything reads its KV): count its
        tokens as computed and cache the blocks they filled. Returns its sequences still running."""
        running = [item for item in batch if item.seq.status is SequenceStatus.RUNNING]
        for item in running:
            item.seq.num_computed_tokens += item.num_tokens
            self.block_manager.commit_full_blocks(item.seq)
        return [item.seq for item in running]

    def update_from_output(self, seqs: list[Sequence], tokens: list[int]) -> None:
        """Each sampled token joins its sequence (the next step computes its KV)."""
        for seq, token in zip(seqs, tokens):
            seq.append_token(token)

    def cool(self, seqs: list[Sequence], hot_window: int, kind: str) -> list[tuple[int, int]]:
        """Move the running sequences' full blocks older than the hot window to cold blocks of
        `kind`; returns the (hot, cold) pairs the KV cache must quantize."""
        pairs: list[tuple[int, int]] = []
        for seq in seqs:
            if seq.status is SequenceStatus.RUNNING:
                pairs += self.block_manager.cool_blocks(seq, hot_window, kind)
        return pairs

    # --- host pool resize -----------------------------------------------------------
    def plan_host_resize(self, num_blocks: int) -> HostResize:
        """A host pool of `num_blocks` holding the swapped-out sequences' blocks; nothing
        changes until `resize_host` (the KV cache copies `remap` in between)."""
        return self.block_manager.plan_host_resize(num_blocks, self.swapped)

    def resize_host(self, plan: HostResize) -> None:
        plan.commit()
