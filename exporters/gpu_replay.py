"""The replay back end: cycles through a file recorded by `inferd gpu record`, for tests
and for demos on machines without a GPU."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from inferd.exporters.gpu_reading import GpuSnapshot

REPLAY_FORMAT = "inferd-gpu-replay/1"


class ReplayBackend:
    """Cycles through the snapshots of a recorded file, one per read()."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.snapshots = load_replay(self.path)
        self._next = 0
        self._lock = threading.Lock()

    def read(self) -> GpuSnapshot:
        with self._lock:
            snapshot = self.snapshots[self._next]
            self._next = (self._next + 1) % len(self.snapshots)
        return snapshot

    def close(self) -> None:
        pass


def load_replay(path: Path) -> list[GpuSnapshot]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"GPU replay file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"GPU replay file {path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != REPLAY_FORMAT:
        raise ValueError(f"GPU replay file {path}: expected format {REPLAY_FORMAT!r}")
    snapshots = [GpuSnapshot.from_json(s) for s in data.get("snapshots", [])]
    if not snapshots:
        raise ValueError(f"GPU replay file {path} holds no snapshots")
    return snapshots


def write_replay(path: Path, snapshots: list[GpuSnapshot], meta: dict[str, Any] | None = None) -> None:
    doc = {"format": REPLAY_FORMAT, "meta": meta or {}, "snapshots": [s.to_json() for s in snapshots]}
    Path(path).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
