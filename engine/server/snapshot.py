"""A copy of the engine's state for readers outside the engine core (/metrics): taken in
the core process, sent to the API server with the step outputs."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ..stats import EngineCounters, KVSnapshot


@dataclass(slots=True, frozen=True)
class EngineSnapshot:
    timestamp: float
    num_running: int
    num_waiting: int
    num_swapped: int
    kv: KVSnapshot
    counters: EngineCounters
    tunables: dict[str, Any]


def empty_snapshot(config) -> EngineSnapshot:
    """What /metrics shows before the engine core has reported (while it loads)."""
    return EngineSnapshot(0.0, 0, 0, 0, KVSnapshot(0, 0, 0, 0, 0.0, 0, 0), EngineCounters(), dict(config.tunables()))


def take_snapshot(engine, now: float) -> EngineSnapshot:
    """Call only from the thread that owns `engine`."""
    sched = engine.scheduler
    # vLLM counts requests, not sequences; a preempted request counts as waiting (V1 has no swapped queue).
    running = {s.request_id for s in sched.running}
    waiting = {s.request_id for s in (*sched.waiting, *sched.swapped)} - running
    return EngineSnapshot(
        timestamp=now,
        num_running=len(running),
        num_waiting=len(waiting),
        num_swapped=len({s.request_id for s in sched.swapped}),
        kv=engine.kv_snapshot(),
        counters=_counters_with_graphs(engine),
        tunables=dict(engine.config.tunables()),
    )


def _counters_with_graphs(engine) -> EngineCounters:
    """A copy of the engine's counters with the decode graphs its runner holds now (none
    without the fast path, or with a decoder that runs its steps eagerly): they are
    captured at start and when a batch size first runs, so they are read, not counted."""
    counters = copy.deepcopy(engine.counters)
    decode = getattr(engine.runner, "fast_decode", None)
    counters.cuda_graphs_captured = len(getattr(decode, "graphs", ())) + len(getattr(decode, "chunk_graphs", ()))
    return counters
