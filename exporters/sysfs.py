"""Small helpers for reading sysfs and procfs files under a root path.

Every reader in `exporters/` and `agent/` takes a root (``/sys``, ``/proc`` or a
fixture tree) and joins paths below it, so tests run the real code on fixture trees.
Parsers here work on plain strings; the ``read_*`` functions do the I/O.
"""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path) -> str:
    """The file's content without the trailing newline; raises FileNotFoundError."""
    return path.read_text().rstrip("\n")


def read_optional(path: Path) -> str | None:
    """The file's content, or None when it is absent or unreadable (sysfs files vanish
    with hot-unplug, and some attributes exist only on some devices)."""
    try:
        return read_text(path)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    except OSError:  # sysfs read of an attribute the device cannot answer (EIO, EINVAL)
        return None


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Parse the kernel's list format ("0-15,32-47", "3", "") into sorted CPU ids."""
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return ()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                first, last = int(lo), int(hi)
                if last < first:
                    raise ValueError
                cpus.update(range(first, last + 1))
            else:
                cpus.add(int(lo))
        except ValueError:
            raise ValueError(f"bad CPU list {text!r}: cannot parse {part!r}") from None
    return tuple(sorted(cpus))


def format_cpulist(cpus: tuple[int, ...] | list[int]) -> str:
    """The inverse of parse_cpulist, in the kernel's compact form."""
    ids = sorted(set(cpus))
    if not ids:
        return ""
    ranges: list[str] = []
    start = prev = ids[0]
    for cpu in ids[1:] + [None]:  # type: ignore[list-item]
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        ranges.append(f"{start}-{prev}" if prev != start else f"{start}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(ranges)


def parse_key_value_counts(text: str, source: str = "input") -> dict[str, int]:
    """Parse "name value" lines (numastat, vmstat, aer_dev_*) into a dict; blank lines
    are skipped, anything else that is not a name and an integer is an error."""
    values: dict[str, int] = {}
    for line_number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise ValueError(f"{source} line {line_number}: expected 'name value', got {line!r}")
        try:
            values[fields[0]] = int(fields[1])
        except ValueError:
            raise ValueError(f"{source} line {line_number}: {fields[1]!r} is not an integer") from None
    return values


def read_key_value_counts(path: Path) -> dict[str, int]:
    return parse_key_value_counts(read_text(path), source=str(path))
