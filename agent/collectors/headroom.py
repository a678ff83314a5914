"""The headroom collector: requests/s the node can still take at its step-time SLO.

Each scrape reads the engine's /metrics (step time and batch size histograms, finished
requests, output tokens per request, max_num_seqs), turns the change since the previous
scrape into one (mean batch, mean step time) point, keeps the last `window` points and
estimates capacity and headroom from them (agent.doctor.headroom). Until the points
vary in batch size there is no slope and no sample; the families are still there.

    inferd_headroom_requests_per_second           capacity at the SLO less the current rate
    inferd_headroom_capacity_requests_per_second  requests/s at the SLO
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from inferd.agent.doctor.headroom import Totals, estimate
from inferd.agent.doctor.thresholds import DEFAULT
from inferd.exporters.engine_metrics import EngineMetricsConfig, EngineMetricsReader
from inferd.exporters.registry import BuildContext, Built, CollectorEntry

FAMILIES = (
    "inferd_scheduler_step_duration_seconds",
    "inferd_scheduler_batch_size",
    "vllm:request_success",
    "vllm:request_generation_tokens",
    "inferd_engine_tunable",
)


class HeadroomCollector:
    name = "headroom"

    def __init__(self, reader: EngineMetricsReader, slo_step_s: float, window: int = 30):
        if slo_step_s <= 0:
            raise ValueError(f"--headroom-step-slo must be > 0 seconds, got {slo_step_s}")
        if window < 3:
            raise ValueError(f"headroom window must hold at least 3 points, got {window}")
        self.reader, self.slo_step_s = reader, slo_step_s
        self._points: collections.deque[tuple[float, float]] = collections.deque(maxlen=window)
        self._rates: collections.deque[float] = collections.deque(maxlen=window)
        self._last: Totals | None = None
        self._last_time: float | None = None

    def collect(self) -> Iterable[Metric]:
        families = self.reader.read()  # CollectorUnavailable when the engine is unreachable
        sums: dict[str, float] = {}
        max_seqs = None
        for family in families:
            for sample in family.samples:
                if sample.name == "inferd_engine_tunable" and sample.labels.get("param") == "max_num_seqs":
                    max_seqs = sample.value
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
        totals = Totals.from_values(sums.get)
        headroom = GaugeMetricFamily(
            "inferd_headroom_requests_per_second",
            "Requests/s the node can still take at its step-time SLO (capacity less the current rate)",
        )
        capacity = GaugeMetricFamily(
            "inferd_headroom_capacity_requests_per_second",
            "Requests/s the node can take at its step-time SLO, from step time against batch size",
        )
        if totals is not None:
            self._update(totals, time.monotonic())
            result = None
            if totals.gen_count > 0:
                tokens_per_request = totals.gen_sum / totals.gen_count
                current = self._rates[-1] if self._rates else 0.0
                result = estimate(list(self._points), self.slo_step_s, tokens_per_request, current, max_seqs)
            if result is not None:
                headroom.add_metric([], result.headroom_rps)
                capacity.add_metric([], result.capacity_rps)
        yield headroom
        yield capacity

    def _update(self, totals: Totals, now: float) -> None:
        if self._last is not None and self._last_time is not None:
            point = totals.point_since(self._last)
            if point is not None:
                self._points.append(point)
            elapsed = now - self._last_time
            if elapsed > 0:
                self._rates.append(max(totals.requests - self._last.requests, 0.0) / elapsed)
        self._last, self._last_time = totals, now


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("headroom collector")
    group.add_argument(
        "--headroom-step-slo",
        type=float,
        default=DEFAULT.headroom_step_slo_seconds,
        help="decode step (inter-token) latency in seconds the headroom figure keeps",
    )


def build(context: BuildContext) -> Built | None:
    if context.engine_metrics is None:
        return None  # --no-engine: no engine to measure
    reader = EngineMetricsReader(EngineMetricsConfig(url=context.engine_metrics.config.url, families=FAMILIES))
    return Built(HeadroomCollector(reader, context.args.headroom_step_slo))


ENTRY = CollectorEntry(
    "headroom",
    "requests/s the engine can still take at its step-time SLO (from step time against batch size)",
    build,
    add_arguments=add_arguments,
)
