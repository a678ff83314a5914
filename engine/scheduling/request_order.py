"""The order the scheduler serves its sequences in: priorities, aging and SLO tiers
(vLLM's request queue policies, as functions over the scheduler's queues; they read
sequences and change nothing).

Priorities mean what vLLM's priority scheduling makes them mean: a lower value is
handled earlier, 0 is the default, negative values are allowed, ties go to the earlier
arrival. Urgency is the effective priority, the request's priority less one level per
`priority_aging_steps` steps since it arrived, so a request that waits long enough
overtakes any newer one and low priorities are never starved.

SLO classes (engine/request/slo.py) split the queue in two tiers: requests with a TTFT deadline
come before best-effort ones, whatever their priorities. Within the deadline tier the
order is effective priority, then least slack (the deadline less the predicted time to
compute what is left of the prompt, at the engine's measured prefill rate:
engine/scheduling/ttft_predictor.py); within the best-effort tier, effective priority then arrival.
Aging works within a tier and never lifts a best-effort request past a deadline one: under
sustained overload every best-effort request would age past every newer deadline request
and the order would become first-come-first-served, so interactive requests would miss.
What keeps best effort from starving is its share of the seats (`best_effort_seat_share`
of `max_num_seqs`): while best-effort sequences hold fewer seats than that, the most
urgent waiting ones are admitted before deadline requests (`admission_order`), and a
deadline request never takes a seat that would leave best effort with fewer.
"""

from __future__ import annotations

from ..request.sequence import Sequence
from .ttft_predictor import TtftPredictor


def has_deadline(seq: Sequence) -> bool:
    return seq.slo is not None and seq.slo.deadline is not None


def slack(seq: Sequence, predictor: TtftPredictor) -> float | None:
    """Its TTFT deadline less the predicted time to compute the rest of its prompt
    (wall-clock seconds; now is common to all, so it is not subtracted); None: best effort."""
    if seq.slo is None or seq.slo.deadline is None:
        return None
    return seq.slo.deadline - (predictor.prefill_seconds(seq.num_uncomputed_tokens) or 0.0)


def order(seqs: list[Sequence], step: int, aging: int, predictor: TtftPredictor | None) -> list[Sequence]:
    """Most urgent first at scheduler step `step`: with deadlines (a `predictor` for their
    slack), deadline requests before best-effort ones; then lowest effective priority, then
    (deadline requests) least slack, then earliest arrival."""
    if predictor is None:  # the effective priority, inlined: this sorts every queue every step
        return sorted(seqs, key=lambda s: (s.priority - (step - s.arrival_step) // aging, s.times.arrival, s.seq_id))

    def key(s: Sequence) -> tuple[float, ...]:
        left = slack(s, predictor)
        tier = (0, left) if left is not None else (1, 0.0)
        return (tier[0], s.priority - (step - s.arrival_step) // aging, tier[1], s.times.arrival, s.seq_id)

    return sorted(seqs, key=key)


def admission_order(waiting: list[Sequence], running: list[Sequence], best_effort_seats: int) -> list[Sequence]:
    """`waiting` (in `order`) in admission order: while best-effort sequences hold fewer
    than their seats, that many of the most urgent waiting best-effort requests go first."""
    missing = best_effort_seats - sum(1 for s in running if not has_deadline(s))
    if missing <= 0:
        return waiting
    lifted = [s for s in waiting if not has_deadline(s)][:missing]
    if not lifted or len(lifted) == len(waiting):
        return waiting
    lifted_ids = {id(s) for s in lifted}
    return lifted + [s for s in waiting if id(s) not in lifted_ids]
