"""Which processes get their own labels, and what happens to their counts when they exit.

Watched: the engine (a callable the agent passes, asked on every collection because the
engine restarts with a new pid), ``--watch-pid`` and ``--watch-comm``. Everything else is
counted in-kernel under tgid 0 and exported as ``comm="other"``.

A process that leaves the watch list (it exited, the engine restarted with a new pid, or
a child forked from a watched comm exec'd into another name) keeps its kernel map keys
until we drop them; its counts then move to "other" (`DepartedProcessFolder`), so every
exported counter stays monotonic and the labels stay those of the watch list.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

OTHER_TGID = 0
OTHER_COMM = "other"
COMM_LEN = 15  # TASK_COMM_LEN - 1: the kernel truncates longer names


@dataclass(slots=True)
class WatchList:
    procfs_root: Path = Path("/proc")
    pids_fn: Callable[[], Iterable[int] | int | None] | None = None
    pids: tuple[int, ...] = ()
    comms: tuple[str, ...] = ()
    _comm_cache: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.procfs_root = Path(self.procfs_root)
        self.pids = tuple(self.pids)
        self.comms = tuple(self.comms)
        for pid in self.pids:
            if not isinstance(pid, int) or pid <= 0:
                raise ValueError(f"watched pid must be a positive integer, got {pid!r}")
        for comm in self.comms:
            if not comm or len(comm) > COMM_LEN:
                raise ValueError(f"watched comm {comm!r} must be 1..{COMM_LEN} characters (the kernel's comm length)")
        if self.pids_fn is not None and not callable(self.pids_fn):
            raise ValueError(f"pids_fn must be callable, got {type(self.pids_fn).__name__}")

    def resolve(self) -> set[int]:
        """The watched tgids now: the callable's, the fixed ones, and those whose comm matches."""
        pids = set(self.pids)
        if self.pids_fn is not None:
            try:
                found = self.pids_fn()
            except Exception:  # the engine supervisor's state must not break a scrape
                log.exception("watch_pids_fn failed; watching the fixed pids only")
                found = None
            if isinstance(found, int):
                found = (found,)
            pids.update(int(p) for p in found or () if p and int(p) > 0)
        if self.comms:
            pids.update(self.pids_with_comm(self.comms))
        return pids

    def pids_with_comm(self, comms: Iterable[str]) -> set[int]:
        wanted = set(comms)
        matches = set()
        for entry in self.procfs_root.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:  # exited while we looked
                continue
            if comm in wanted:
                matches.add(int(entry.name))
                self._comm_cache[int(entry.name)] = comm
        return matches

    def comm_of(self, tgid: int, fresh: bool = False) -> str:
        """The process's comm; the last one seen once it has gone; "other" for tgid 0."""
        if tgid == OTHER_TGID:
            return OTHER_COMM
        if fresh or tgid not in self._comm_cache:
            try:
                self._comm_cache[tgid] = (self.procfs_root / str(tgid) / "comm").read_text().strip()
            except OSError:
                self._comm_cache.setdefault(tgid, "")
        return self._comm_cache[tgid]

    def is_alive(self, tgid: int) -> bool:
        return (self.procfs_root / str(tgid)).exists()

    def forget(self, tgids: Iterable[int]) -> None:
        for tgid in tgids:
            self._comm_cache.pop(tgid, None)


class DepartedProcessFolder:
    """Adds the counts of processes no longer watched to "other" for good.

    Rows are keyed by tuples whose first element is the tgid. `fold` returns the rows to
    export and the tgids whose kernel keys the caller must now delete; deleting them is
    what stops the same counts from being folded twice.
    """

    __slots__ = ("_folded",)

    def __init__(self) -> None:
        self._folded: dict[tuple[int, ...], int] = {}

    def fold(
        self, rows: dict[tuple[int, ...], int], is_watched: Callable[[int], bool]
    ) -> tuple[dict[tuple[int, ...], int], set[int]]:
        out: dict[tuple[int, ...], int] = {}
        departed: set[int] = set()
        for key, count in rows.items():
            tgid = key[0]
            if tgid != OTHER_TGID and (tgid in departed or not is_watched(tgid)):
                departed.add(tgid)
                other_key = (OTHER_TGID, *key[1:])
                self._folded[other_key] = self._folded.get(other_key, 0) + count
            else:
                out[key] = out.get(key, 0) + count
        for key, count in self._folded.items():
            out[key] = out.get(key, 0) + count
        return out, departed
