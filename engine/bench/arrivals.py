"""When each request of a level is sent: seconds from the level's start.

- poisson: exactly round(rate x duration) arrivals, uniform and independent over the
  level: a Poisson process conditioned on its count, so every level sends the same
  number of requests for a given seed and its mean rate is the offered rate exactly.
- gamma: inter-arrival gaps drawn from a gamma distribution of shape B (`--burstiness`)
  and mean 1/rate, as vLLM's `--burstiness` does: B = 1 is Poisson, B < 1 burstier
  (the gaps' coefficient of variation is 1/sqrt(B)), B > 1 more even. The gaps are
  scaled so the last arrival lands at count/rate (vLLM does the same), which keeps the
  mean rate exact and the shape of the gaps.
- trace: the timestamps of a JSONL file (`{"timestamp": s, "prompt_len"?, "output_len"?,
  "class"?}` a line), replayed from the first one; with rates given, time-scaled so the
  trace's mean rate is each level's rate.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ARRIVALS = ("poisson", "gamma", "trace")


def num_arrivals(rate: float, duration_s: float) -> int:
    return max(1, round(rate * duration_s))


def poisson_times(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    return sorted(rng.uniform(0.0, duration_s) for _ in range(num_arrivals(rate, duration_s)))


def gamma_times(rate: float, duration_s: float, burstiness: float, rng: random.Random) -> list[float]:
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness!r}")
    n = num_arrivals(rate, duration_s)
    times, t = [], 0.0
    for _ in range(n):
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        times.append(t)
    scale = (n / rate) / times[-1] if times[-1] > 0 else 1.0
    return [x * scale for x in times]


@dataclass(frozen=True, slots=True)
class TraceEntry:
    timestamp: float
    prompt_len: int | None = None
    output_len: int | None = None
    slo_class: str | None = None


def _length(line: dict, key: str, where: str) -> int | None:
    value = line.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where}: {key} must be an integer >= 1, got {value!r}")
    return value


def parse_trace(lines: Iterable[str], source: str = "trace") -> list[TraceEntry]:
    """Entries sorted by timestamp; at least two, spanning more than zero seconds (a
    trace's rate is its count over its span)."""
    entries = []
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        where = f"{source} line {number}"
        try:
            line = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(line, dict):
            raise ValueError(f"{where}: expected an object, got {type(line).__name__}")
        stamp = line.get("timestamp")
        if not isinstance(stamp, (int, float)) or isinstance(stamp, bool) or stamp != stamp:
            raise ValueError(f"{where}: needs a numeric timestamp (seconds), got {stamp!r}")
        cls = line.get("class")
        if cls is not None and not isinstance(cls, str):
            raise ValueError(f"{where}: class must be a string, got {cls!r}")
        entries.append(
            TraceEntry(float(stamp), _length(line, "prompt_len", where), _length(line, "output_len", where), cls)
        )
    entries.sort(key=lambda e: e.timestamp)
    if len(entries) < 2 or entries[-1].timestamp <= entries[0].timestamp:
        raise ValueError(f"{source}: needs at least two entries with different timestamps")
    return entries


def read_trace(path: str | Path) -> list[TraceEntry]:
    with open(path, encoding="utf-8") as f:
        return parse_trace(f, str(path))


def trace_rate(entries: list[TraceEntry]) -> float:
    """Requests per second over the trace's span."""
    return len(entries) / (entries[-1].timestamp - entries[0].timestamp)


def trace_times(entries: list[TraceEntry], rate: float | None = None) -> list[float]:
    """Arrival times from the first entry; scaled to mean `rate` when given."""
    scale = 1.0 if rate is None else trace_rate(entries) / rate
    first = entries[0].timestamp
    return [(e.timestamp - first) * scale for e in entries]
