"""Collector isolation: every collector is timed and guarded.

A collector is any object with a ``name`` attribute and a ``collect()`` method that
yields ``prometheus_client`` metric families (client_python's custom-collector
interface). `CollectorSet` runs each one per scrape, materialises its output so a
failure half-way drops only that collector's families, and always emits

    inferd_collector_up{collector="..."}                1 or 0
    inferd_collector_duration_seconds{collector="..."}  time spent collecting

    inferd_collector_source_absent{collector="..."}     1 or 0

so one failing source never fails a scrape (client_python on its own would).
A collector that knows why it cannot read its source raises `CollectorUnavailable`
with the reason: `up` is 0. A collector whose source is not there by nature on this
host (no NVML library or no NVIDIA GPU for the gpu collector, no NVIDIA GPU on the PCI
bus for pcie) raises `SourceAbsent`, a kind of `CollectorUnavailable`: it did its job
and found nothing to read, so `up` stays 1 and `source_absent` is 1. `up` 0 thus
always means a source that should be readable was not. Reasons are logged once per
change, not on every scrape.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Iterable, Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as _PromCollector

log = logging.getLogger(__name__)


class CollectorUnavailable(Exception):
    """The collector's source cannot be read (file missing, not permitted, device error)."""


class SourceAbsent(CollectorUnavailable):
    """The collector's source does not exist on this host (no GPU, no NVML library):
    nothing to read, and nothing wrong."""


class Collector(Protocol):
    name: str

    def collect(self) -> Iterable[Metric]: ...


class CollectorSet(_PromCollector):
    def __init__(self, collectors: Iterable[Collector] = ()):
        self._collectors: list[Collector] = []
        self._last_error: dict[str, str | None] = {}
        self._lock = threading.Lock()
        for c in collectors:
            self.add(c)

    def add(self, collector: Collector) -> None:
        names = {c.name for c in self._collectors}
        if collector.name in names:
            raise ValueError(f"collector {collector.name!r} registered twice")
        self._collectors.append(collector)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self._collectors]

    def describe(self) -> list[Metric]:
        # Returning nothing tells client_python not to call collect() at register time
        # and not to check for name clashes, which we cannot know before a scrape.
        return []

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("inferd_collector_up", "1 if the collector read its source on this scrape, else 0", labels=["collector"])
        duration = GaugeMetricFamily(
            "inferd_collector_duration_seconds", "Time the collector took on this scrape", labels=["collector"]
        )
        absent = GaugeMetricFamily(
            "inferd_collector_source_absent",
            "1 if the collector's source does not exist on this host (no GPU, no NVML library), else 0",
            labels=["collector"],
        )
        with self._lock:  # concurrent scrapes would double the load on slow sources
            for collector in self._collectors:
                start = time.perf_counter()
                families, error, is_absent = self._run_one(collector)
                duration.add_metric([collector.name], time.perf_counter() - start)
                up.add_metric([collector.name], 0.0 if error and not is_absent else 1.0)
                absent.add_metric([collector.name], 1.0 if is_absent else 0.0)
                self._log_change(collector.name, error, is_absent)
                yield from families
        yield up
        yield duration
        yield absent

    @staticmethod
    def _run_one(collector: Collector) -> tuple[list[Metric], str | None, bool]:
        """(families, reason it read nothing or None, whether its source is absent)."""
        try:
            return list(collector.collect()), None, False
        except SourceAbsent as exc:
            return [], str(exc) or "source absent", True
        except CollectorUnavailable as exc:
            return [], str(exc) or "unavailable", False
        except Exception as exc:  # a collector bug must not fail the scrape
            log.exception("collector %s failed", collector.name)
            return [], f"{type(exc).__name__}: {exc}", False

    def _log_change(self, name: str, error: str | None, is_absent: bool = False) -> None:
        if self._last_error.get(name, "unset") == error:
            return
        self._last_error[name] = error
        if error and is_absent:
            log.info("collector %s: source absent on this host, nothing to collect: %s", name, error)
        elif error:
            log.warning("collector %s down: %s", name, error)
        else:
            log.info("collector %s up", name)
