"""The remediation audit log: one JSON object per line, durable before the engine moves.

Every decision of the remediation policy (an alert received, an action decided,
applied or failed, a verification result, a rollback, a restore) is appended here.
`append` writes, flushes and fsyncs before returning, and the policy appends its
intent before it touches the engine, so a crash between the two leaves the intent on
disk. On start the agent reads the log back (`read`) and rebuilds its cooldowns,
its de-duplication keys and any verification still running from it.

Records are plain dicts; every record has `ts` (Unix seconds), `time` (UTC ISO 8601)
and `event`.

An append is all or nothing: the whole line goes out in one `os.write` on an O_APPEND
descriptor, and a write or fsync that fails (a full disk, an I/O error) truncates the
file back to its size before the write and raises `AuditWriteError`. A torn last line
left by anything else (a crash mid-write) is cut off, with a warning, before the next
append, so it never swallows the record after it; a reader skips and counts a line it
cannot parse and keeps its neighbours.

The file rotates once the next record would take it past `max_bytes`: `audit.jsonl`
becomes `audit.jsonl.1` (`.1` becomes `.2`, ... up to `keep_files`, the oldest is
deleted), and `read` returns the kept files oldest first. What de-duplication needs
outlives the deleted files: the new file starts with a copy (`"carried": true`) of the
last `alert`/`routed` record of every alert still firing.

The log's owner (one `AuditLog` per file) keeps its last `recent_records` records in
memory for GET /v1/actions (`tail`), so answering it reads no file.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CARRIED_EVENTS = ("alert", "routed")  # the records alert de-duplication is rebuilt from
MAX_CARRIED = 10_000  # firing alerts whose records a rotation copies (the oldest beyond are dropped)


@dataclass(slots=True, frozen=True)
class AuditLogConfig:
    max_bytes: int = 16 << 20  # rotate before the file passes this size
    keep_files: int = 4  # rotated files kept beside the current one
    recent_records: int = 10_000  # records GET /v1/actions can answer from memory

    def __post_init__(self) -> None:
        if self.max_bytes < 64 << 10:
            raise ValueError(f"audit log max_bytes must be at least 65536, got {self.max_bytes}")
        if not 1 <= self.keep_files <= 100:
            raise ValueError(f"audit log keep_files must be 1..100, got {self.keep_files}")
        if not 1 <= self.recent_records <= 1_000_000:
            raise ValueError(f"audit log recent_records must be 1..1000000, got {self.recent_records}")


class AuditLogError(OSError):
    """The audit log cannot be opened for appending (raised at start-up)."""

    def __init__(self, path: Path, cause: OSError):
        super().__init__(cause.errno, f"audit log {path} is not writable: {cause}")

    def __str__(self) -> str:  # the message alone: it already carries the cause's errno
        return str(self.strerror)


class AuditWriteError(OSError):
    """An append that did not reach the disk; nothing of it is left in the log."""

    def __init__(self, path: Path, cause: OSError):
        super().__init__(cause.errno, f"cannot append to the audit log {path}: {cause}")

    def __str__(self) -> str:
        return str(self.strerror)


class AuditLog:
    def __init__(
        self,
        path: str | os.PathLike,
        clock: Callable[[], float] = time.time,
        config: AuditLogConfig | None = None,
    ):
        self.path = Path(path)
        self.config = config or AuditLogConfig()
        self.unreadable_lines = 0  # lines the last read() skipped
        self._clock = clock
        self._lock = threading.Lock()
        self._recent: deque[dict[str, Any]] = deque(maxlen=self.config.recent_records)
        self._recent_loaded = False
        # (event, fingerprint, pod_uid) -> the line of the last record of an alert still firing
        self._firing_lines: dict[tuple[str, str, str], bytes] = {}
        self._carry_pending: list[bytes] = []  # carried records a failed append could not write yet
        self._check_writable()

    def _check_writable(self) -> None:
        """Fail now, not at the first alert, when the log cannot be appended to; and cut
        off a torn last line left by a crash."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            existed = self.path.exists()
            fd = self._open()
        except OSError as exc:
            raise AuditLogError(self.path, exc) from exc
        try:
            if existed:
                self._repair_tail(fd)
            elif os.fstat(fd).st_size == 0:
                self.path.unlink()  # the probe's empty file: an unused log leaves nothing behind
        finally:
            os.close(fd)

    # -- writing --

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one record durably (written whole, fsynced) and return it; on failure
        raise AuditWriteError with nothing of the record left in the file."""
        ts = self._clock()
        record = {"ts": round(ts, 3), "time": _iso(ts), "event": event, **fields}
        line = json.dumps(record, sort_keys=False, separators=(",", ":"), default=str) + "\n"
        data = line.encode("utf-8")  # ensure_ascii: one byte per character
        with self._lock:
            self._load_recent()
            try:
                if self._is_full(len(data)):
                    self._rotate()
                self._write_lines([*self._carry_pending, data])
            except OSError as exc:
                raise AuditWriteError(self.path, exc) from exc
            self._carry_pending = []
            written = json.loads(line)  # what a reader will see: default=str applied, tuples as lists
            self._recent.append(json_safe(written))
            self._track_firing(written, data)
        return record

    def _open(self) -> int:
        return os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)

    def _write_lines(self, lines: list[bytes]) -> None:
        fd = self._open()
        try:
            self._repair_tail(fd)
            start = os.fstat(fd).st_size
            try:
                for data in lines:
                    _write_all(fd, data)
                os.fsync(fd)
            except OSError:
                self._truncate_back(fd, start)
                raise
        finally:
            os.close(fd)

    def _truncate_back(self, fd: int, size: int) -> None:
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        except OSError as exc:
            # The next append cuts a torn tail off before it writes (_repair_tail).
            log.error("audit log %s: cannot undo a failed append (%s)", self.path, exc)

    def _repair_tail(self, fd: int) -> None:
        """Make the file end with a newline: complete a last record that only lacks one,
        cut off a last line that is not a record (a torn write)."""
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return
        start = _last_line_start(fd, size)
        tail = os.pread(fd, size - start, start)
        if _parse_record(tail.decode("utf-8", "replace")) is not None:
            _write_all(fd, b"\n")
            return
        os.ftruncate(fd, start)
        os.fsync(fd)
        log.warning(
            "audit log %s ended in a torn line (%d bytes: %r); cut off before appending",
            self.path,
            len(tail),
            tail[:120],
        )

    def _is_full(self, incoming: int) -> bool:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return False
        return size > 0 and size + incoming > self.config.max_bytes

    def _rotate(self) -> None:
        """Shift the files one number up (the oldest kept is replaced) and queue, for the
        head of the new file, a copy of the records of the alerts still firing; at most
        half a file of them, so the new file has room."""
        for number in range(self.config.keep_files, 0, -1):
            older = self._rotated(number - 1)
            if older.exists():
                os.replace(older, self._rotated(number))
        _fsync_dir(self.path.parent)
        carried: list[bytes] = []
        room = self.config.max_bytes // 2
        for line in reversed(self._firing_lines.values()):  # the newest first
            copy = _carried(line)
            room -= len(copy)
            if room < 0:
                log.warning("audit log %s: too many firing alerts to carry over; the oldest are dropped", self.path)
                break
            carried.append(copy)
        self._carry_pending = carried[::-1]
        log.info("audit log %s rotated (%d records of firing alerts carried over)", self.path, len(carried))

    def _rotated(self, number: int) -> Path:
        return self.path if number == 0 else self.path.with_name(f"{self.path.name}.{number}")

    # -- reading --

    def files(self) -> list[Path]:
        """The log's files, oldest first."""
        return [self._rotated(n) for n in range(self.config.keep_files, -1, -1)]

    def read(self) -> list[dict[str, Any]]:
        """All records of the kept files in order; a missing file is an empty log."""
        with self._lock:
            return self._read_locked()

    def tail(self, limit: int) -> list[dict[str, Any]]:
        """The last `limit` records kept in memory (0: all of them), safe to answer as JSON."""
        with self._lock:
            self._load_recent()
            records = list(self._recent)
        return records[-limit:] if limit > 0 else records

    def _read_locked(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        unreadable = 0
        for path in self.files():
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except FileNotFoundError:
                continue
            found, skipped = parse_records(text, source=str(path))
            records += found
            unreadable += skipped
        self.unreadable_lines = unreadable
        if unreadable:
            log.warning("audit log %s: %d unreadable line(s) skipped", self.path, unreadable)
        self._remember(records)
        return records

    def _load_recent(self) -> None:
        if not self._recent_loaded:
            self._read_locked()

    def _remember(self, records: Iterable[dict[str, Any]]) -> None:
        self._recent.clear()
        self._firing_lines.clear()
        for record in records:
            if not record.get("carried"):
                self._recent.append(json_safe(record))
            line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
            self._track_firing(record, line.encode("utf-8"))
        self._recent_loaded = True

    def _track_firing(self, record: dict[str, Any], line: bytes) -> None:
        if record.get("event") not in CARRIED_EVENTS or not isinstance(record.get("fingerprint"), str):
            return
        key = (record["event"], record["fingerprint"], str(record.get("pod_uid", "")))
        self._firing_lines.pop(key, None)
        if record.get("status") == "firing":
            self._firing_lines[key] = line
            if len(self._firing_lines) > MAX_CARRIED:
                del self._firing_lines[next(iter(self._firing_lines))]


def parse_records(text: str, source: str = "audit log") -> tuple[list[dict[str, Any]], int]:
    """(the records of `text`, the number of non-blank lines that are not records)."""
    records = []
    unreadable = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        record = _parse_record(line)
        if record is None:
            log.warning("%s line %d is not JSON or not an audit record (torn write?); skipped", source, number)
            unreadable += 1
            continue
        records.append(record)
    return records, unreadable


def _parse_record(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(record, dict) or "event" not in record or "ts" not in record:
        return None
    return record


def _carried(line: bytes) -> bytes:
    record = json.loads(line)
    record["carried"] = True
    return (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode("utf-8")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def _last_line_start(fd: int, size: int, chunk: int = 64 << 10) -> int:
    """The offset just past the last newline before `size` (0 when there is none)."""
    end = size
    while end > 0:
        begin = max(0, end - chunk)
        found = os.pread(fd, end - begin, begin).rfind(b"\n")
        if found >= 0:
            return begin + found + 1
        end = begin
    return 0


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
