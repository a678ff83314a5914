"""Admission control at the API: refuse at once what cannot make its deadline, and bound
the queue.

The server knows every request it has queued and not yet seen a first token of (the
`queued` table here; the engine reports first tokens in its step statistics, streamed or
not), the requests decoding, and the engine's measured rates (a `TtftPredictor` fed the
step statistics the core sends). A deadline request's predicted TTFT is the prompt tokens
of the deadline requests queued ahead of it (a more urgent priority, or the same priority
and an earlier or equal deadline: the scheduler's order, in which best effort comes after
every deadline request) plus its own, at the prefill rate; plus, when the deadline
sequences decoding, those ahead and its own need more seats than deadline requests may
hold (`max_num_seqs` less best effort's share), the wait for that many seats to free up.
When the prediction exceeds the class's TTFT target by more than `margin` (a share of the
target) the request is refused with 429 and Retry-After, or, for an `on_miss=demote`
class, served as best effort. Best-effort requests are never shed by the deadline check.

The margin defaults to 0 (refuse a request predicted to miss its target at all): on a
2-core CPU at twice the saturation rate with only deadline requests, refusing past twice
the target (margin 1.0) let 89 % of the admitted requests meet it, refusing past the
target 99 %, at the same goodput (BENCHMARKS.md, "SLO classes"). A request that will miss
only delays the requests behind it. Without a measured rate nothing is shed.

The queue caps carry vLLM's names and meanings (`--max-num-queued-reqs`: sequences in
flight, waiting or running, n > 1 counting n; `--max-num-queued-tokens`: prompt tokens of
the requests still before their first token) and answer 503 with Retry-After: the
server, not the request, is the limit. 0 leaves a cap off.

Admission happens before a stream starts, so a stream once started is never cut.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field

from ..config import check_range
from ..request.slo import SloClass
from ..scheduling.ttft_predictor import TtftPredictor
from .errors import ApiError

SHED_DEADLINE, SHED_QUEUE_REQS, SHED_QUEUE_TOKENS = "deadline", "max_num_queued_reqs", "max_num_queued_tokens"
QUEUE_FULL_RETRY_AFTER_S = 1


@dataclass(slots=True)
class AdmissionConfig:
    slo_admission_margin: float = 0.0
    """Refuse a deadline request whose predicted TTFT exceeds its target by more than this
    share of it (0: past the target; 1.0: past twice the target) [0, 100]."""
    max_num_queued_reqs: int = 0
    """Most sequences in flight (waiting or running; n > 1 counts n); 0: no cap (vLLM's name)."""
    max_num_queued_tokens: int = 0
    """Most prompt tokens of requests not yet at their first token; 0: no cap (vLLM's name)."""

    def __post_init__(self) -> None:
        check_range("slo_admission_margin", self.slo_admission_margin, 0.0, 100.0)
        for name in ("max_num_queued_reqs", "max_num_queued_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            check_range(name, value, 0)


@dataclass(slots=True)
class Queued:
    priority: int
    deadline: float | None
    num_prompt_tokens: int
    num_seqs: int
    started: bool = False  # its first token came: it no longer waits for prefill


@dataclass(slots=True)
class Decision:
    demoted: bool = False  # serve as best effort: the deadline cannot be met
    predicted_ttft_s: float | None = None


@dataclass
class Admission:
    config: AdmissionConfig
    predictor: TtftPredictor
    queued: dict[int, Queued] = field(default_factory=dict)
    shed: Counter = field(default_factory=Counter)  # (class, reason) -> requests refused
    demoted: Counter = field(default_factory=Counter)  # class -> requests served as best effort
    _ids: itertools.count = field(default_factory=itertools.count)

    @property
    def num_queued_seqs(self) -> int:
        return sum(q.num_seqs for q in self.queued.values())

    @property
    def num_queued_tokens(self) -> int:
        return sum(q.num_prompt_tokens for q in self.queued.values() if not q.started)

    def ahead(self, priority: int, deadline: float) -> tuple[int, int]:
        """(prompt tokens, sequences) of the deadline requests still before their first token
        that the scheduler serves before a deadline request of this priority and deadline
        (aging aside)."""
        tokens = seqs = 0
        for q in self.queued.values():
            if q.started or q.deadline is None:
                continue
            if q.priority < priority or (q.priority == priority and q.deadline <= deadline):
                tokens += q.num_prompt_tokens
                seqs += q.num_seqs
        return tokens, seqs

    @property
    def num_decoding_deadline_seqs(self) -> int:
        return sum(q.num_seqs for q in self.queued.values() if q.started and q.deadline is not None)

    def check(
        self,
        slo_class: SloClass,
        priority: int,
        deadline: float | None,
        num_prompt_tokens: int,
        num_seqs: int,
        deadline_seats: int | None = None,
    ) -> Decision:
        """Admit, demote, or raise the ApiError that refuses the request. `deadline_seats`:
        the seats deadline sequences may hold now (None: no seat limit is counted)."""
        cfg = self.config
        if cfg.max_num_queued_reqs and self.num_queued_seqs + num_seqs > cfg.max_num_queued_reqs:
            self.shed[slo_class.name, SHED_QUEUE_REQS] += 1
            raise _queue_full(
                f"the server has {self.num_queued_seqs} sequences in flight; --max-num-queued-reqs is "
                f"{cfg.max_num_queued_reqs}"
            )
        queued_tokens = self.num_queued_tokens
        if cfg.max_num_queued_tokens and queued_tokens + num_prompt_tokens > cfg.max_num_queued_tokens:
            self.shed[slo_class.name, SHED_QUEUE_TOKENS] += 1
            raise _queue_full(
                f"{queued_tokens} prompt tokens wait for prefill; with this request's {num_prompt_tokens} that "
                f"exceeds --max-num-queued-tokens {cfg.max_num_queued_tokens}"
            )
        if deadline is None or slo_class.ttft_s is None:
            return Decision()
        tokens_ahead, seqs_ahead = self.ahead(priority, deadline)
        seats_short = 0
        if deadline_seats is not None:
            seats_short = self.num_decoding_deadline_seqs + seqs_ahead + num_seqs - deadline_seats
        predicted = self.predictor.predict(tokens_ahead, num_prompt_tokens, seats_short, deadline_seats or 1)
        if predicted is None or predicted <= slo_class.ttft_s * (1.0 + cfg.slo_admission_margin):
            return Decision(predicted_ttft_s=predicted)
        if slo_class.on_miss == "demote":
            self.demoted[slo_class.name] += 1
            return Decision(demoted=True, predicted_ttft_s=predicted)
        self.shed[slo_class.name, SHED_DEADLINE] += 1
        retry_after = max(1, math.ceil(predicted - slo_class.ttft_s))
        raise ApiError(
            429,
            f"SLO class {slo_class.name!r} cannot be met now: the predicted wait for a first token is "
            f"{predicted:.3f} s against a target of {slo_class.ttft_s:g} s; retry after {retry_after} s",
            "slo_class",
            "slo_unattainable",
            headers={"Retry-After": str(retry_after)},
        )

    def enter(self, priority: int, deadline: float | None, num_prompt_tokens: int, num_seqs: int) -> int:
        ticket = next(self._ids)
        self.queued[ticket] = Queued(priority, deadline, num_prompt_tokens, num_seqs)
        return ticket

    def started(self, ticket: int) -> None:
        q = self.queued.get(ticket)
        if q is not None:
            q.started = True

    def leave(self, ticket: int) -> None:
        self.queued.pop(ticket, None)


def _queue_full(message: str) -> ApiError:
    return ApiError(503, message, None, "queue_full", headers={"Retry-After": str(QUEUE_FULL_RETRY_AFTER_S)})
