"""`inferd gpu record PATH [--interval S] [--count N]`: record NVML snapshots to a replay file.

The file is what `--gpu-backend replay:PATH` plays back. The first GPM result needs
one full interval, so recording waits that long before the first snapshot.
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    record = sub.add_parser("record", help="record NVML snapshots into a replay JSON file")
    record.add_argument("path", type=Path, help="output file (JSON)")
    record.add_argument(
        "--interval", type=float, default=1.0, help="seconds between snapshots and GPM window (default 1)"
    )
    record.add_argument("--count", type=int, default=10, help="number of snapshots (default 10)")
    record.add_argument("--note", default="", help="free text stored in the file's meta")


def record(path: Path, interval_s: float, count: int, note: str = "", backend=None) -> int:
    """Write `count` snapshots taken `interval_s` apart; returns the number written."""
    from inferd.exporters.gpu_nvml import NvmlBackend
    from inferd.exporters.gpu_replay import write_replay

    if interval_s <= 0:
        raise ValueError(f"--interval must be > 0, got {interval_s}")
    if count < 1:
        raise ValueError(f"--count must be >= 1, got {count}")
    owned = backend is None
    backend = backend or NvmlBackend(gpm_interval_s=interval_s)
    snapshots = []
    try:
        time.sleep(interval_s * 1.2)  # let the first GPM window complete
        next_at = time.monotonic()
        for _ in range(count):
            snapshots.append(backend.read())
            next_at += interval_s
            time.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        if owned:
            backend.close()
    meta = {
        "interval_s": interval_s,
        "note": note,
        "python": platform.python_version(),
        "recorded_by": "inferd gpu record",
    }
    write_replay(path, snapshots, meta)
    return len(snapshots)


def run(args: argparse.Namespace) -> int:
    from inferd.exporters.registry import CollectorUnavailable

    try:
        written = record(args.path, args.interval, args.count, args.note)
    except (ValueError, CollectorUnavailable) as exc:
        print(f"inferd gpu record: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {written} snapshots to {args.path}")
    return 0
