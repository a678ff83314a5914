"""A scenario's workload: phases of open-loop Poisson arrivals, streamed and timed.

A phase sends at its own rate whatever the server does (open loop: a slow server gets
a queue, not fewer requests), prompts of random token ids with a length drawn uniformly
from its range, and `max_tokens` output tokens (ignore_eos). Arrivals and prompts come
from one seeded generator, so the same seed gives the same trace whichever way the
scenario runs. Arrival times are engine/bench/arrivals.py's Poisson process
(round(rate x duration) arrivals, uniform over the phase); each request is streamed and
timed by engine/bench/serve_client.py into a goodput RequestRecord, and judged by
goodput.py's definitions (`meets`: completed, TTFT <= target, TPOT <= target).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from inferd.engine.bench.arrivals import poisson_times
from inferd.engine.bench.datasets import SampleRequest
from inferd.engine.bench.goodput import RequestRecord, meets
from inferd.engine.bench.serve_client import completion_body, send
from inferd.engine.bench.slo_classes import SloClass

REQUEST_TIMEOUT_S = 300.0
MIN_REQUEST_TIMEOUT_S = 60.0


def request_timeout(phases: Sequence[Phase]) -> float:
    """How long the client waits for one answer: as long as the whole workload (at least
    60 s, at most 300 s), so a request to a hung engine counts as lost soon after the run
    instead of holding a compressed run for 5 minutes."""
    return min(REQUEST_TIMEOUT_S, max(MIN_REQUEST_TIMEOUT_S, sum(p.duration_s for p in phases)))


VOCAB = (5, 500)  # token ids drawn for prompts (the tiny model's vocabulary is larger)


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    duration_s: float
    rate: float  # requests per second, Poisson
    prompt_len: tuple[int, int]  # tokens, both ends included
    max_tokens: int
    slo_class: str | None = None  # sent as the request's slo_class when given

    def __post_init__(self) -> None:
        if not self.duration_s > 0:
            raise ValueError(f"phase {self.name!r}: duration_s must be > 0, got {self.duration_s!r}")
        if not self.rate >= 0:
            raise ValueError(f"phase {self.name!r}: rate must be >= 0, got {self.rate!r}")
        low, high = self.prompt_len
        if not 1 <= low <= high:
            raise ValueError(f"phase {self.name!r}: prompt_len must be 1 <= low <= high, got {self.prompt_len!r}")
        if self.max_tokens < 1:
            raise ValueError(f"phase {self.name!r}: max_tokens must be >= 1, got {self.max_tokens!r}")

    def scaled(self, time_scale: float) -> Phase:
        """The same phase on a clock `time_scale` times as fast (rates and lengths kept)."""
        return Phase(
            self.name, self.duration_s * time_scale, self.rate, self.prompt_len, self.max_tokens, self.slo_class
        )


@dataclass(frozen=True, slots=True)
class Planned:
    """One request of the trace: when (seconds from the workload's start), in which phase, what."""

    t: float
    phase: str
    prompt: tuple[int, ...]
    max_tokens: int
    slo_class: str | None = None


def plan(phases: Sequence[Phase], seed: int) -> list[Planned]:
    """The trace: every request's send time and prompt, in time order."""
    rng = random.Random(seed)
    out: list[Planned] = []
    start = 0.0
    for phase in phases:
        times = poisson_times(phase.rate, phase.duration_s, rng) if phase.rate > 0 else []
        for t in times:
            length = rng.randint(*phase.prompt_len)
            prompt = tuple(rng.randrange(*VOCAB) for _ in range(length))
            out.append(Planned(start + t, phase.name, prompt, phase.max_tokens, phase.slo_class))
        start += phase.duration_s
    return out


def phase_starts(phases: Sequence[Phase]) -> dict[str, float]:
    """Each phase's start, seconds from the workload's start."""
    starts: dict[str, float] = {}
    t = 0.0
    for phase in phases:
        starts.setdefault(phase.name, t)
        t += phase.duration_s
    return starts


@dataclass(slots=True)
class Sent:
    """A request sent: when (seconds from the workload's start), its phase, its record."""

    t: float
    phase: str
    record: RequestRecord
    done: bool = False

    @property
    def t_done(self) -> float | None:
        return self.t + self.record.e2e if self.done and not math.isnan(self.record.e2e) else None

    @property
    def is_lost(self) -> bool:
        """Not served and not refused with 429: a non-2xx answer, a transport error or a
        stream that failed."""
        return self.done and not self.record.is_completed and self.record.status != 429

    def summary(self, slo: SloClass) -> dict[str, Any]:
        r = self.record

        def num(x: float | None) -> float | None:
            return None if x is None or math.isnan(x) else round(x, 6)

        return {
            "t": round(self.t, 6),
            "phase": self.phase,
            "prompt_len": r.prompt_len,
            "output_tokens": r.num_output_tokens,
            "status": r.status,
            "ttft": num(r.ttft),
            "tpot": num(r.tpot),
            "e2e": num(r.e2e),
            "met": meets(r, slo),
            "error": r.error or None,
        }


@dataclass(slots=True)
class Attainment:
    """Bookkeeping over a set of finished requests."""

    finished: int = 0
    completed: int = 0
    met: int = 0
    ttft_met: int = 0
    tpot_met: int = 0
    lost: int = 0
    shed: int = 0

    def add(self, sent: Sent, slo: SloClass) -> None:
        r = sent.record
        self.finished += 1
        self.lost += sent.is_lost
        self.shed += r.status == 429
        if not r.is_completed:
            return
        self.completed += 1
        self.met += meets(r, slo)
        self.ttft_met += slo.ttft_s is None or r.ttft <= slo.ttft_s
        tpot = r.tpot
        self.tpot_met += slo.tpot_s is None or tpot is None or tpot <= slo.tpot_s

    @classmethod
    def of(cls, sent: Sequence[Sent], slo: SloClass) -> Attainment:
        out = cls()
        for s in sent:
            out.add(s, slo)
        return out

    def share(self, count: int) -> float | None:
        """`count` over the finished requests (goodput.py's attainment: over all of them)."""
        return count / self.finished if self.finished else None

    @property
    def attainment(self) -> float | None:
        return self.share(self.met)


@dataclass(slots=True)
class Workload:
    """Sends `trace` against `url` in real time; `sent` grows as requests go out."""

    url: str
    trace: list[Planned]
    model: str = "tiny"
    timeout_s: float = REQUEST_TIMEOUT_S
    sent: list[Sent] = field(default_factory=list)
    started: float | None = None  # time.monotonic() at t = 0

    def now(self) -> float:
        """Seconds since the workload started (0 before)."""
        return 0.0 if self.started is None else time.monotonic() - self.started

    async def run(self, client: httpx.AsyncClient, started: float | None = None) -> list[Sent]:
        """Send every request at its time, then wait for all of them to finish."""
        self.started = time.monotonic() if started is None else started
        tasks = []
        for item in self.trace:
            delay = item.t - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            record = RequestRecord(item.slo_class or "default", prompt_len=len(item.prompt))
            sent = Sent(self.now(), item.phase, record)
            self.sent.append(sent)
            tasks.append(asyncio.create_task(self._send(client, item, sent)))
        await asyncio.gather(*tasks)
        return self.sent

    async def _send(self, client: httpx.AsyncClient, item: Planned, sent: Sent) -> None:
        body = completion_body(self.model, SampleRequest("", len(item.prompt), item.max_tokens), {}, item.slo_class)
        body["prompt"] = list(item.prompt)  # token ids: the length is exact whatever the tokenizer
        try:
            await send(client, self.url, body, sent.record, self.timeout_s)
        finally:
            sent.done = True


def client() -> httpx.AsyncClient:
    """An open-loop client: no cap on connections (a cap would close the loop)."""
    return httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
