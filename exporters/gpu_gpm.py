"""GPM sampling (Hopper and newer): GPM metrics need two samples an interval apart, so a
thread takes them and a scrape only reads the latest result instead of sleeping."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from inferd.exporters.gpu_reading import GPM_METRICS

log = logging.getLogger(__name__)


class GpmSampler:
    """Takes a GPM sample per GPU every interval in a thread; keeps the latest metrics.

    Consecutive windows share a sample (the end of one is the start of the next), so
    each interval costs one nvmlGpmSampleGet per GPU.
    """

    def __init__(self, nvml: Any, handles: dict[int, Any], interval_s: float):
        if interval_s <= 0:
            raise ValueError(f"GPM interval must be > 0 s, got {interval_s}")
        self._nvml = nvml
        self._handles = handles
        self.interval_s = interval_s
        self._latest: dict[int, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpm-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 2)

    def latest(self, index: int) -> dict[str, float] | None:
        with self._lock:
            result = self._latest.get(index)
            return dict(result) if result else None

    def _run(self) -> None:
        nvml = self._nvml
        pairs = {i: [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()] for i in self._handles}
        previous: dict[int, float] = {}
        try:
            while not self._stop.is_set():
                for index, handle in self._handles.items():
                    try:
                        self._sample(index, handle, pairs[index], previous)
                    except Exception as exc:  # one GPU's failure must not stop the others
                        log.debug("GPM sample of GPU %d failed: %s", index, exc)
                        previous.pop(index, None)
                self._stop.wait(self.interval_s)
        finally:
            for first, second in pairs.values():
                for s in (first, second):
                    try:
                        nvml.nvmlGpmSampleFree(s)
                    except Exception:
                        pass

    def _sample(self, index: int, handle: Any, pair: list[Any], previous: dict[int, float]) -> None:
        nvml = self._nvml
        nvml.nvmlGpmSampleGet(handle, pair[1])
        now = time.monotonic()
        if index in previous:
            metrics = self._metrics(pair[0], pair[1])
            metrics["interval_s"] = now - previous[index]
            with self._lock:
                self._latest[index] = metrics
        previous[index] = now
        pair.reverse()  # this sample starts the next window

    def _metrics(self, first: Any, second: Any) -> dict[str, float]:
        nvml = self._nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1 = first
        request.sample2 = second
        for i, metric_id in enumerate(GPM_METRICS):
            request.metrics[i].metricId = metric_id
        nvml.nvmlGpmMetricsGet(request)
        result = {}
        for i, key in enumerate(GPM_METRICS.values()):
            if request.metrics[i].nvmlReturn == nvml.NVML_SUCCESS:
                result[key] = float(request.metrics[i].value)
        return result
