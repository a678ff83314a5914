"""A scenario's timeline: one record every `interval_s` while the workload runs.

Each record says, for the interval just ended: the offered rate (requests sent) and the
served rate (requests completed), the SLO attainment of the requests that finished in it
(both targets, and TTFT and TPOT apart, over every request finished: goodput.py's
attainment), requests lost and in flight; the engine's cumulative KV page faults and
preemptions and their rates (the engine's own /metrics, exact counts, not Prometheus'
windows); the engine's tunables in force (GET /admin/config); the alerts pending or
firing (Prometheus /api/v1/alerts); and the agent's audit records since the last record
(GET /v1/actions); and the scenario's watched Prometheus queries (`watch`, what a
GPU rule reads). Each collector is on its own: one that fails leaves None in its
fields and its error under `errors`, and the record is still written.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from inferd.engine.bench.slo_classes import SloClass

from .workload import Attainment, Phase, Sent, Workload

log = logging.getLogger(__name__)

FAULTS = "inferd_kv_page_faults_total"
PREEMPTIONS = "vllm:num_preemptions_total"
COLLECT_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Endpoints:
    engine: str
    prometheus: str
    agent: str
    admin_token: str


def engine_counters(text: str) -> dict[str, float]:
    """KV page faults (every kind) and preemptions, summed, from an exposition."""
    totals = {FAULTS: 0.0, PREEMPTIONS: 0.0}
    found = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
                found.add(sample.name)
    missing = set(totals) - found
    if missing:
        raise KeyError(f"no {', '.join(sorted(missing))} in the engine's /metrics")
    return totals


def phase_at(phases: Sequence[Phase], t: float) -> str | None:
    """The phase running at `t` seconds from the start; None after the last one."""
    end = 0.0
    for phase in phases:
        end += phase.duration_s
        if t < end:
            return phase.name
    return None


def _rate(now: float | None, before: float | None, dt: float) -> float | None:
    if now is None or before is None or dt <= 0 or now < before:  # a restarted engine starts from 0
        return None
    return (now - before) / dt


@dataclass(slots=True)
class Recorder:
    endpoints: Endpoints
    workload: Workload
    phases: Sequence[Phase]
    slo: SloClass
    interval_s: float
    unix_start: float = 0.0  # time.time() at the workload's t = 0 (audit records carry Unix time)
    watch: Mapping[str, str] = field(default_factory=dict)  # name -> PromQL, each record's `watch`
    records: list[dict[str, Any]] = field(default_factory=list)
    _open: list[Sent] = field(default_factory=list)
    _num_sent: int = 0
    _last_t: float = 0.0
    _last_ts: float = 0.0
    _last_counters: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s!r}")
        self._last_ts = self.unix_start  # audit records before the run are not its decisions

    async def run(self, client: httpx.AsyncClient, stop: asyncio.Event) -> list[dict[str, Any]]:
        """A record every interval until `stop` is set, then a last one."""
        tick = 1
        while not stop.is_set():
            delay = tick * self.interval_s - self.workload.now()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    break
                except asyncio.TimeoutError:
                    pass
            await self.record(client)
            tick = max(tick + 1, math.floor(self.workload.now() / self.interval_s) + 1)  # a slow record skips ticks
        await self.record(client)
        return self.records

    async def record(self, client: httpx.AsyncClient) -> dict[str, Any]:
        t = self.workload.now()
        dt = t - self._last_t
        collected = await asyncio.gather(
            self._collect("engine_metrics", self._engine_metrics, client),
            self._collect("tunables", self._tunables, client),
            self._collect("alerts", self._alerts, client),
            self._collect("actions", self._actions, client),
            self._collect("watch", self._watch, client),
        )
        errors = {
            name: error
            for name, (_, error) in zip(("engine_metrics", "tunables", "alerts", "actions", "watch"), collected)
            if error
        }
        counters, tunables, alerts, actions, watched = (value for value, _ in collected)
        out: dict[str, Any] = {
            "t": round(t, 3),
            "phase": phase_at(self.phases, t),
            "interval_s": round(dt, 3),
            **self._requests(dt),
            "kv_page_faults": counters[FAULTS] if counters else None,
            "kv_page_faults_per_s": None,
            "preemptions": counters[PREEMPTIONS] if counters else None,
            "preemptions_per_s": None,
            "tunables": tunables,
            "alerts": alerts,
            "actions": actions,
            "errors": errors,
        }
        if self.watch:
            out["watch"] = watched
        before = self._last_counters
        if counters and before:
            out["kv_page_faults_per_s"] = _rate(counters[FAULTS], before[FAULTS], dt)
            out["preemptions_per_s"] = _rate(counters[PREEMPTIONS], before[PREEMPTIONS], dt)
        if counters:
            self._last_counters = counters
        self._last_t = t
        self.records.append(out)
        return out

    def _requests(self, dt: float) -> dict[str, Any]:
        sent = self.workload.sent
        offered = len(sent) - self._num_sent
        self._open.extend(sent[self._num_sent :])
        self._num_sent = len(sent)
        finished = [s for s in self._open if s.done]
        self._open = [s for s in self._open if not s.done]
        a = Attainment.of(finished, self.slo)
        per_s = 1.0 / dt if dt > 0 else None
        return {
            "offered_rps": offered * per_s if per_s is not None else None,
            "served_rps": a.completed * per_s if per_s is not None else None,
            "finished": a.finished,
            "met": a.met,
            "attainment": a.attainment,
            "ttft_attainment": a.share(a.ttft_met),
            "tpot_attainment": a.share(a.tpot_met),
            "lost": a.lost,
            "shed": a.shed,
            "in_flight": len(self._open),
        }

    async def _collect(
        self, name: str, collector: Callable[[httpx.AsyncClient], Awaitable[Any]], client: httpx.AsyncClient
    ) -> tuple[Any, str | None]:
        try:
            return await asyncio.wait_for(collector(client), COLLECT_TIMEOUT_S), None
        except Exception as exc:  # a collector failing leaves a hole in its fields, not in the timeline
            log.debug("collector %s failed: %r", name, exc)
            return None, f"{type(exc).__name__}: {exc}"

    async def _engine_metrics(self, client: httpx.AsyncClient) -> dict[str, float]:
        response = await client.get(f"{self.endpoints.engine}/metrics")
        response.raise_for_status()
        return engine_counters(response.text)

    async def _tunables(self, client: httpx.AsyncClient) -> dict[str, Any]:
        response = await client.get(
            f"{self.endpoints.engine}/admin/config",
            headers={"Authorization": f"Bearer {self.endpoints.admin_token}"},
        )
        response.raise_for_status()
        return response.json()["config"]

    async def _alerts(self, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        response = await client.get(f"{self.endpoints.prometheus}/api/v1/alerts")
        response.raise_for_status()
        alerts = response.json()["data"]["alerts"]
        return sorted(
            ({"name": a["labels"]["alertname"], "state": a["state"], "active_at": a.get("activeAt")} for a in alerts),
            key=lambda a: (a["name"], a["state"]),
        )

    async def _watch(self, client: httpx.AsyncClient) -> dict[str, float | None]:
        """Each watched query's largest sample now (None: no sample)."""
        values: dict[str, float | None] = {}
        for name, query in self.watch.items():
            response = await client.get(f"{self.endpoints.prometheus}/api/v1/query", params={"query": query})
            response.raise_for_status()
            samples = [float(r["value"][1]) for r in response.json()["data"]["result"]]
            finite = [v for v in samples if math.isfinite(v)]
            values[name] = max(finite) if finite else None
        return values

    async def _actions(self, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        response = await client.get(f"{self.endpoints.agent}/v1/actions", params={"limit": 0})
        response.raise_for_status()
        new = [r for r in response.json()["records"] if r["ts"] > self._last_ts]
        if new:
            self._last_ts = max(r["ts"] for r in new)
        return [{**r, "t": round(r["ts"] - self.unix_start, 3)} for r in new]


def wall_clock() -> tuple[float, float]:
    """(time.monotonic(), time.time()) read together: the workload's t = 0 in both clocks."""
    return time.monotonic(), time.time()
