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

Priorities mean what vLLM's priority scheduling makes them mean: a lower value is
handled earlier, 0 is the default, negative values are allowed, ties go to the earlier
arrival. Urgency is the effective priority, the request's priority less one level per
`priority_aging_steps` steps since it arrived, so a request that waits long enough
overtakes any newer one and low priorities are never starved.

SLO classes (engine/slo.py) split the queue in two tiers: requests with a TTFT deadline
come before best-effort ones, whatever their priorities. Within the deadline tier the
order is effective priority, then least slack (the deadline less the predicted time to
compute what is left of the prompt, at the engine's measured prefill rate:
engine/ttft_predictor.py); within the best-effort tier, effective priority then arrival.
Aging works within a tier and never lifts a best-effort request past a deadline one: under
sustained overload every best-effort request would age past every newer deadline request
and the order would become first-come-first-served, so interactive requests would miss.
What keeps best effort from starving is its share of the seats (`best_effort_seat_share`
of `max_num_seqs`): while best-effort sequences hold fewer seats than that, the most
urgent waiting ones are admitted before deadline requests, and a deadline request never
takes a seat that would leave best effort with fewer.
Running sequences keep that order when blocks run out, so a running deadline sequence is
never preempted for a best-effort one. When every seat is taken and a
deadline request waits, the least urgent best-effort running sequence is preempted
(recompute) so that it is admitted in that step, as long as best effort keeps its share:
otherwise its first token waits for some best-effort sequence to finish its whole output.
Without deadlines the order is exactly the one above, and nothing is preempted for a seat.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .block_pool import BlockCopy
from .config import EngineConfig
from .sampling.slot_table import SlotTable
from .sequence import Sequence, SequenceStatus
from .slo import best_effort_seats
from .ttft_predictor import TtftPredictor


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


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, predictor: TtftPredictor | None = None):
        self.config = config
        self.block_manager = block_manager
        self.predictor = predictor if predictor is not None else TtftPredictor()
        self.has_deadlines = False  # a sequence with a TTFT deadline was ever added: order by slack too
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.slots = SlotTable()  # a running sequence's row in the sampler's tables
        self.step_count = 0
        self.num_preemptions = 0

    # --- queues ---------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if seq.slo is not None and seq.slo.deadline is not None:
            self.has_deadlines = True
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of whatever queue holds it and release its blocks."""
        for queue in (self.waiting, self.running, self.swapped):
            if seq in queue:
                queue.remove(seq)
        if seq.block_table:
            self.block_manager.free(seq)
        if seq.host_block_table:
            self.block_manager.release_host(seq)
        self.slots.release(seq)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def effective_priority(self, seq: Sequence) -> int:
        """Lower runs first (vLLM's meaning); waiting lowers it one level per aging period."""
        return seq.priority - (self.step_count - seq.arrival_step) // self.config.priority_aging_steps

    def slack(self, seq: Sequence) -> float | None:
        """Its TTFT deadline less the predicted time to compute the rest of its prompt
        (wall-clock seconds; now is common to all, so it is not subtracted); None: best effort."""
        if seq.slo is None or seq.slo.deadline is None:
            return None
        return seq.slo.deadline - (self.predictor.prefill_seconds(seq.num_uncomputed_tokens) or 0.0)

    def _order(self, seqs: list[Sequence]) -> list[Sequence]:
        """Most urgent first: with deadlines, deadline requests before best-effort ones; then
        lowest effective priority, then (deadline requests) least slack, then earliest arrival."""
        step, aging = self.step_count, self.config.priority_aging_steps  # effective_priority, inlined
        if not self.has_deadlines:
            return sorted(
                seqs, key=lambda s: (s.priority - (step - s.arrival_step) // aging, s.times.arrival, s.seq_id)
            )

        def key(s: Sequence) -> tuple[float, ...]:
            slack = self.slack(s)
            tier = (0, slack) if slack is not None else (1, 0.0)
            return (tier[0], s.priority - (step - s.arrival_step) // aging, tier[1], s.times.arrival, s.seq_id)

        return sorted(seqs, key=key)

    @property
    def best_effort_seats(self) -> int:
        """Seats kept for best-effort sequences when deadline requests compete for them."""
        return best_effort_seats(self.config.max_num_seqs, self.config.best_effort_seat_share)

    def _admission_order(self) -> list[Sequence]:
        """The waiting queue in admission order: `_order`, except that while best-effort
        sequences hold fewer than their seats, that many of the most urgent waiting best-effort
        requests go first."""
        order = self._order(self.waiting)
        if not self.has_deadlines:
            return order
        missing = self.best_effort_seats - sum(1 for s in self.running if not _has_deadline(s))
        if missing <= 0:
            return order
        lifted = [s for s in order if not _has_deadline(s)][:missing]
        if not lifted or len(lifted) == len(order):
            return order
        lifted_ids = {id(s) for s in lifted}
        return lifted + [s for s in order if id(s) not in lifted_ids]

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
        best_effort_running = sum(1 for s in queue if not _has_deadline(s))
        seats = self.config.max_num_seqs - len(self.running)
        if any(not _has_deadline(s) for s in self.waiting):  # admission gives them their missing seats first
            seats -= max(0, self.best_effort_seats - best_effort_running)
        for seq in self._order(self.waiting):
            if not _has_deadline(seq):
                continue  # the rest of the order is best effort
            if seats > 0:
                seats -= 1
                continue
            if best_effort_running <= self.best_effort_seats:
                return
            victim = next((v for v in reversed(queue) if not _has_deadline(v)), None)
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


def _has_deadline(seq: Sequence) -> bool:
    return seq.slo is not None and seq.slo.deadline is not None
