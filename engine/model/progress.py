"""Progress of long commands on stderr, without a dependency.

On a terminal a bar redrawn in place (`loading weights [######....] 130/291 tensors 4.2 s`);
otherwise (a log file, a pipe) a plain line every `interval_s` seconds and one at the end.
Quick work prints nothing: nothing appears before `delay_s` has passed, so loading the
tiny model or a test run stays silent. INFERD_PROGRESS=0 turns it off, =1 draws even
quick work.

    with Progress(len(names), "loading weights", unit="tensors") as progress:
        for name in names:
            ...
            progress.update()
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO

ENV = "INFERD_PROGRESS"
BAR_WIDTH = 24


class Progress:
    def __init__(
        self,
        total: int,
        desc: str,
        unit: str = "",
        stream: IO[str] | None = None,
        delay_s: float = 1.0,
        interval_s: float = 10.0,
        redraw_s: float = 0.1,
    ):
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total = total
        self.desc = desc
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        setting = os.environ.get(ENV, "")
        self.enabled = setting != "0"
        self.delay_s = 0.0 if setting == "1" else delay_s
        self.interval_s = interval_s
        self.redraw_s = redraw_s
        try:
            self.is_tty = bool(self.stream.isatty())
        except (AttributeError, OSError, ValueError):  # no isatty, or a closed stream
            self.is_tty = False
        self.count = 0
        self._start = time.monotonic()
        self._last_draw: float | None = None  # None: nothing drawn yet

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._start

    def update(self, n: int = 1) -> None:
        self.count = min(self.total, self.count + n) if self.total else self.count + n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._start < self.delay_s:
            return
        every = self.redraw_s if self.is_tty else self.interval_s
        if self._last_draw is None or now - self._last_draw >= every:
            self._draw(now)

    def close(self) -> None:
        """The final state, when anything was drawn (or the work was slow enough to be)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if self._last_draw is None and now - self._start < self.delay_s:
            return
        self._draw(now, final=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _draw(self, now: float, final: bool = False) -> None:
        self._last_draw = now
        elapsed = now - self._start
        unit = f" {self.unit}" if self.unit else ""
        counted = f"{self.count}/{self.total}{unit}" if self.total else f"{self.count}{unit}"
        try:
            if self.is_tty:
                done = int(BAR_WIDTH * self.count / self.total) if self.total else 0
                bar = "#" * done + "." * (BAR_WIDTH - done)
                self.stream.write(f"\r{self.desc} [{bar}] {counted} {elapsed:.1f} s" + ("\n" if final else ""))
            elif final:
                self.stream.write(f"{self.desc}: {counted}, done in {elapsed:.1f} s\n")
            else:
                share = f" ({100 * self.count / self.total:.0f}%)" if self.total else ""
                self.stream.write(f"{self.desc}: {counted}{share}, {elapsed:.0f} s\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream must not stop the work
            self.enabled = False


def note(message: str, stream: IO[str] | None = None) -> None:
    """One line of progress on stderr (a phase starting), unless INFERD_PROGRESS=0."""
    if os.environ.get(ENV, "") == "0":
        return
    stream = stream if stream is not None else sys.stderr
    try:
        stream.write(message + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass
