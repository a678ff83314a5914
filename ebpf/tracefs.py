"""Tracepoint metadata from tracefs: does an event exist, and what its enum values mean.

Reason codes such as ``migrate:mm_migrate_pages``'s ``reason`` change between kernels,
so their names are read from the event's format file (the ``__print_symbolic`` table in
its ``print fmt``) instead of being written down here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

TRACEFS_CANDIDATES = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")

_SYMBOL_ENTRY = re.compile(r"\{\s*(-?(?:0x[0-9a-fA-F]+|\d+))[uUlL]*\s*,\s*\"([^\"]*)\"\s*\}")


def find_tracefs(candidates: tuple[str, ...] = TRACEFS_CANDIDATES) -> Path | None:
    """The first mounted tracefs (one with an ``events`` folder), or None."""
    for path in candidates:
        if Path(path, "events").is_dir():
            return Path(path)
    return None


def mount_tracefs(path: str = TRACEFS_CANDIDATES[0]) -> Path | None:
    """Mount tracefs at ``path`` (needs root); None when that fails."""
    result = subprocess.run(["mount", "-t", "tracefs", "nodev", path], capture_output=True, text=True)
    if result.returncode != 0 or not Path(path, "events").is_dir():
        return None
    return Path(path)


def event_format_path(tracefs: Path, event: str) -> Path:
    category, _, name = event.partition(":")
    if not category or not name:
        raise ValueError(f"tracepoint {event!r} is not of the form category:name")
    return tracefs / "events" / category / name / "format"


def has_event(tracefs: Path, event: str) -> bool:
    return event_format_path(tracefs, event).exists()


def parse_print_symbolic(format_text: str, field: str) -> dict[int, str]:
    """Value -> name from ``__print_symbolic(REC->field, {0, "a"}, {1, "b"}, ...)``."""
    marker = f"__print_symbolic(REC->{field},"
    start = format_text.find(marker)
    if start < 0:
        raise ValueError(f"format has no __print_symbolic table for field {field!r}")
    depth, first = 0, start + len("__print_symbolic")
    end = first
    for end in range(first, len(format_text)):
        depth += {"(": 1, ")": -1}.get(format_text[end], 0)
        if depth == 0:
            break
    table = {int(value, 0): name for value, name in _SYMBOL_ENTRY.findall(format_text[start:end])}
    if not table:
        raise ValueError(f"__print_symbolic table for field {field!r} is empty")
    return table


def read_symbolic_field(tracefs: Path, event: str, field: str) -> dict[int, str]:
    return parse_print_symbolic(event_format_path(tracefs, event).read_text(), field)


def function_tracing_problem(tracefs: Path, function: str) -> str | None:
    """Why ``function`` cannot take a function-entry (fentry/kfunc) probe, if tracefs says.

    None when it is listed as traceable, or when the kernel has no list to ask (then
    only trying can tell). Kernels in lockdown refuse to show the list at all.
    """
    listing = tracefs / "available_filter_functions"
    try:
        with listing.open() as lines:
            for line in lines:
                if line.split(" ", 1)[0].strip() == function:
                    return None
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        return f"the kernel does not permit function tracing (reading {listing}: {exc.strerror})"
    return f"{function} is not traceable (not in {listing})"
