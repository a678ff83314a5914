"""The remediation audit log: one JSON object per line, durable before the engine moves.

Every decision of the remediation policy (an alert received, an action decided,
applied or failed, a verification result, a rollback, a restore) is appended here.
`append` writes, flushes and fsyncs before returning, and the policy appends its
intent before it touches the engine, so a crash between the two leaves the intent on
disk. On start the agent reads the log back (`read`) and rebuilds its cooldowns,
its de-duplication keys and any verification still running from it.

Records are plain dicts; every record has `ts` (Unix seconds), `time` (UTC ISO 8601)
and `event`. A torn last line (crash mid-write) is skipped with a warning.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class AuditLog:
    def __init__(self, path: str | os.PathLike, clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one record durably (flushed and fsynced) and return it."""
        ts = self._clock()
        record = {"ts": round(ts, 3), "time": _iso(ts), "event": event, **fields}
        line = json.dumps(record, sort_keys=False, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
        return record

    def read(self) -> list[dict[str, Any]]:
        """All records in order; a missing file is an empty log."""
        with self._lock:
            try:
                text = self.path.read_text(encoding="utf-8")
            except FileNotFoundError:
                return []
        return parse_lines(text, source=str(self.path))

    def tail(self, limit: int) -> list[dict[str, Any]]:
        """The last `limit` records (0: all), made safe to answer as JSON."""
        records = self.read()
        return [json_safe(r) for r in (records[-limit:] if limit > 0 else records)]


def parse_lines(text: str, source: str = "audit log") -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            log.warning("%s line %d is not JSON (torn write?); skipped", source, number)
            continue
        if not isinstance(record, dict) or "event" not in record or "ts" not in record:
            log.warning("%s line %d is not an audit record; skipped", source, number)
            continue
        records.append(record)
    return records


def json_safe(value: Any) -> Any:
    """`value` with what a strict UTF-8 JSON response refuses written out as text: a lone
    surrogate (from a `\\ud800` escape) as its escape, NaN and infinities as "nan"/"inf".
    Records are read back from a file anything may have written, and one such record
    must not fail the whole answer."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
