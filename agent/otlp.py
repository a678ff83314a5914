"""OTLP push of every agent metric, over HTTP (opentelemetry-sdk's OTLP/HTTP exporter).

Two threads and a bounded queue between them:

    collect thread: every interval, read the sources (the agent's CollectorSet, the
        engine's KV metrics) -> convert to OTLP MetricsData -> put on the queue,
        never waiting: when the queue is full the oldest batch is dropped
        (inferd_otlp_dropped_total{reason="queue_full"}).
    send thread: take a batch -> OTLPMetricExporter.export(); a batch the receiver
        did not take is dropped (reason="export_failed"), not retried forever.

So a receiver that is down or slow costs at most `queue_size` batches of memory and
never delays collection or /metrics.

Mapping from Prometheus families: counters become cumulative monotonic Sums named
without `_total` (OTLP convention; Prometheus-side exporters add it back), gauges and
untyped families become Gauges, labels become attributes. Histograms and summaries
are not forwarded (the agent exports none; the engine's stay on its own port).
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlparse

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

Source = Callable[[], Iterable[Metric]]


@dataclass(slots=True)
class OtlpConfig:
    endpoint: str  # http://host:4318 or the full .../v1/metrics URL
    interval_s: float = 10.0
    queue_size: int = 8
    timeout_s: float = 2.0
    service_name: str = "inferd-agent"

    def __post_init__(self) -> None:
        parsed = urlparse(self.endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(
                f"--otlp-endpoint must be an http(s) URL such as http://127.0.0.1:4318, got {self.endpoint!r}"
            )
        if not parsed.path.rstrip("/"):
            self.endpoint = self.endpoint.rstrip("/") + "/v1/metrics"
        if self.interval_s <= 0 or self.timeout_s <= 0:
            raise ValueError("OTLP interval_s and timeout_s must be > 0")
        if self.queue_size < 1:
            raise ValueError(f"OTLP queue_size must be >= 1, got {self.queue_size}")


def to_metrics_data(families: Iterable[Metric], start_ns: int, now_ns: int, resource_attributes: dict[str, str]):
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.metrics.export import Metric as OtelMetric
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    metrics = []
    for family in families:
        data: Sum | Gauge
        if family.type == "counter":
            points = [
                NumberDataPoint(dict(s.labels), start_ns, now_ns, s.value)
                for s in family.samples
                if s.name.endswith("_total") or s.name == family.name
            ]
            data = Sum(points, AggregationTemporality.CUMULATIVE, is_monotonic=True)
        elif family.type in ("gauge", "unknown", "untyped", "info", "stateset"):
            points = [NumberDataPoint(dict(s.labels), start_ns, now_ns, s.value) for s in family.samples]
            data = Gauge(points)
        else:
            continue
        if points:
            metrics.append(OtelMetric(family.name, family.documentation, "", data))
    scope = ScopeMetrics(InstrumentationScope("inferd.agent"), metrics, "")
    return MetricsData([ResourceMetrics(Resource.create(resource_attributes), [scope], "")])


class OtlpPusher:
    """Also a collector (name "otlp") for its own drop and send counters."""

    name = "otlp"

    def __init__(self, config: OtlpConfig, sources: list[Source], exporter=None):
        self.config = config
        self.sources = list(sources)
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            exporter = OTLPMetricExporter(endpoint=config.endpoint, timeout=config.timeout_s)
            # it logs an ERROR per failed batch; the agent logs changes and counts drops instead
            logging.getLogger("opentelemetry.exporter.otlp.proto.http").setLevel(logging.CRITICAL)
        self.exporter = exporter
        self._receiver_ok: bool | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=config.queue_size)
        self._dropped = {"queue_full": 0, "export_failed": 0}
        self._sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._start_ns = time.time_ns()
        self._resource = {"service.name": config.service_name, "host.name": socket.gethostname()}
        self._threads = [
            threading.Thread(target=self._collect_loop, name="otlp-collect", daemon=True),
            threading.Thread(target=self._send_loop, name="otlp-send", daemon=True),
        ]

    @property
    def dropped(self) -> dict[str, int]:
        with self._lock:
            return dict(self._dropped)

    @property
    def sent(self) -> int:
        with self._lock:
            return self._sent

    def start(self) -> None:
        log.info("OTLP push to %s every %.1f s", self.config.endpoint, self.config.interval_s)
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=self.config.timeout_s + 2)
        try:
            self.exporter.shutdown()
        except Exception:
            pass

    def collect_once(self) -> None:
        """Read every source and queue one batch; never blocks on the receiver."""
        families: list[Metric] = []
        for source in self.sources:
            try:
                families.extend(source())
            except Exception as exc:  # an unreachable engine must not stop the push
                log.debug("OTLP source %r skipped: %s", source, exc)
        batch = to_metrics_data(families, self._start_ns, time.time_ns(), self._resource)
        while True:
            try:
                self._queue.put_nowait(batch)
                return
            except queue.Full:
                try:
                    self._queue.get_nowait()  # the oldest batch is the least useful
                    with self._lock:
                        self._dropped["queue_full"] += 1
                except queue.Empty:
                    pass

    def send_one(self, timeout_s: float) -> bool:
        """Export one queued batch; False when none was waiting."""
        from opentelemetry.sdk.metrics.export import MetricExportResult

        try:
            batch = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return False
        try:
            result = self.exporter.export(batch, timeout_millis=self.config.timeout_s * 1000)
        except Exception as exc:
            log.debug("OTLP export raised: %s", exc)
            result = MetricExportResult.FAILURE
        ok = result == MetricExportResult.SUCCESS
        with self._lock:
            if ok:
                self._sent += 1
            else:
                self._dropped["export_failed"] += 1
        if ok != self._receiver_ok:
            self._receiver_ok = ok
            if ok:
                log.info("OTLP receiver %s accepts metrics", self.config.endpoint)
            else:
                log.warning(
                    "OTLP receiver %s does not accept metrics; dropping batches "
                    '(inferd_otlp_dropped_total{reason="export_failed"})',
                    self.config.endpoint,
                )
        return True

    def _collect_loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.collect_once()
            except Exception:
                log.exception("OTLP collection failed")
            self._stop.wait(max(0.0, self.config.interval_s - (time.monotonic() - started)))

    def _send_loop(self) -> None:
        while not self._stop.is_set():
            self.send_one(timeout_s=0.2)

    def collect(self) -> Iterable[Metric]:
        dropped = CounterMetricFamily(
            "inferd_otlp_dropped",
            "OTLP metric batches dropped, by reason (queue_full, export_failed)",
            labels=["reason"],
        )
        for reason, count in sorted(self.dropped.items()):
            dropped.add_metric([reason], float(count))
        sent = CounterMetricFamily("inferd_otlp_exported", "OTLP metric batches the receiver accepted")
        sent.add_metric([], float(self.sent))
        depth = GaugeMetricFamily("inferd_otlp_queue_batches", "OTLP metric batches waiting to be sent")
        depth.add_metric([], float(self._queue.qsize()))
        yield dropped
        yield sent
        yield depth
