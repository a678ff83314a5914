"""GPU back ends: where the GPU collector's readings come from, and how one is chosen.

A back end returns a `GpuSnapshot` (exporters.gpu_reading) per scrape:

- `NvmlBackend` (exporters.gpu_nvml) reads NVML; GPM through `GpmSampler` (exporters.gpu_gpm).
- `ReplayBackend` (exporters.gpu_replay) cycles through a recorded JSON file.
- `LazyBackend` opens one on first read and again after it failed, so the agent starts
  on a host whose NVML is missing or not yet loaded.

`open_backend("nvml")` / `open_backend("replay:PATH")` picks one from the CLI spec.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from inferd.exporters.gpu_nvml import NvmlBackend
from inferd.exporters.gpu_reading import GpuSnapshot
from inferd.exporters.gpu_replay import ReplayBackend
from inferd.exporters.registry import CollectorUnavailable


class GpuBackend(Protocol):
    def read(self) -> GpuSnapshot: ...

    def close(self) -> None: ...


def open_backend(spec: str, gpm_interval_s: float = 1.0) -> GpuBackend:
    """`nvml` or `replay:PATH` (as given to --gpu-backend)."""
    if spec == "nvml":
        return NvmlBackend(gpm_interval_s=gpm_interval_s)
    if spec.startswith("replay:"):
        return ReplayBackend(Path(spec.removeprefix("replay:")))
    raise ValueError(f"unknown GPU back end {spec!r}: use 'nvml' or 'replay:PATH'")


class LazyBackend:
    """Opens a back end on first read, and again after it failed, at most every retry_s.

    The agent starts even when NVML is missing (a GPU-less machine, a driver not yet
    loaded); the GPU collector then reports the source absent (no NVML library, no GPU)
    or down (a driver that fails) with the reason until NVML answers.
    """

    def __init__(self, opener: Callable[[], GpuBackend], retry_s: float = 30.0):
        if retry_s < 0:
            raise ValueError(f"retry_s must be >= 0, got {retry_s}")
        self._opener = opener
        self.retry_s = retry_s
        self._backend: GpuBackend | None = None
        self._reason = "not opened yet"
        self._reason_kind: type[CollectorUnavailable] = CollectorUnavailable
        self._last_try = -float("inf")
        self._lock = threading.Lock()

    def read(self) -> GpuSnapshot:
        with self._lock:
            if self._backend is None:
                now = time.monotonic()
                if now - self._last_try < self.retry_s:
                    raise self._reason_kind(self._reason)
                self._last_try = now
                try:
                    self._backend = self._opener()
                except CollectorUnavailable as exc:
                    self._reason, self._reason_kind = str(exc), type(exc)
                    raise
            backend = self._backend
        return backend.read()

    def close(self) -> None:
        with self._lock:
            if self._backend is not None:
                self._backend.close()
                self._backend = None
