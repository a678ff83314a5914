"""Per-SLO-class metrics: latency histograms, attainment, shedding, the predictor's error.

A request is judged when it finishes, against its class's targets: time to first token
(arrival to the first token of its first sequence) and time per output token (decode
time over the tokens after the first). Both come from the core's finished-request
statistics, so a non-streaming request, whose first token the API never sees, is judged
as a streaming one is. A demoted request is judged against its class's targets too: it
was admitted under that class and the operator is judged on it. A best-effort class
(no TTFT target; `default` when no class is configured) gets histograms, no attainment.

Shed and demoted counts are `Admission`'s own (`shed`, `demoted`), read at scrape time.
Every class's series start at 0, so `rate()` and the boards see a class before its first
request.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..request.slo import SloClass, SloClasses
from ..stats import FinishedRequestStats
from .admission import SHED_DEADLINE, SHED_QUEUE_REQS, SHED_QUEUE_TOKENS, Admission

# 5 ms to 30 min: an interactive class's 50 ms target and a batch class's half hour both
# fall between buckets fine enough to read a p99 from (vLLM's floor at 0.3 s and cap at
# 60 s for end-to-end latency read neither).
SLO_LATENCY_BUCKETS = [
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1200.0,
    1800.0,
]
# The `reason` label of shed requests: the 429's error code for a deadline refusal, the
# flag that refused for a 503 queue_full.
SHED_REASONS = {
    SHED_DEADLINE: "slo_unattainable",
    SHED_QUEUE_REQS: SHED_QUEUE_REQS,
    SHED_QUEUE_TOKENS: SHED_QUEUE_TOKENS,
}
TARGETS = ("ttft", "tpot")
RESULTS = ("met", "missed")
DIRECTIONS = ("over", "under")


class SloLogger:
    """Histograms and attainment counters, fed as requests finish (the API process)."""

    def __init__(self, registry: CollectorRegistry, slo_classes: SloClasses):
        self.slo_classes = slo_classes
        self.ttft = Histogram(
            "inferd_slo_time_to_first_token_seconds",
            "Time to first token by SLO class.",
            ["slo_class"],
            buckets=SLO_LATENCY_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            "inferd_slo_time_per_output_token_seconds",
            "Time per output token after the first, per request, by SLO class.",
            ["slo_class"],
            buckets=SLO_LATENCY_BUCKETS,
            registry=registry,
        )
        self.requests = Counter(
            "inferd_slo_requests",
            "Finished requests of a class with a target, by whether they met it.",
            ["slo_class", "target", "result"],
            registry=registry,
        )
        self.prediction_error = Histogram(
            "inferd_slo_ttft_prediction_error_seconds",
            "Admission's predicted TTFT minus the actual one, by sign (over: predicted later "
            "than it came; under: earlier, the side that admits misses).",
            ["slo_class", "direction"],
            buckets=SLO_LATENCY_BUCKETS,
            registry=registry,
        )
        for name in slo_classes.names:
            self.ttft.labels(name)
            self.tpot.labels(name)
            for direction in DIRECTIONS:
                self.prediction_error.labels(name, direction)
            for target in self._targets(self._class(name)):
                for result in RESULTS:
                    self.requests.labels(name, target, result)

    def _class(self, name: str) -> SloClass:
        return self.slo_classes.classes.get(name) or SloClass(name)  # the implicit best-effort default

    @staticmethod
    def _targets(c: SloClass) -> list[str]:
        if c.is_best_effort:
            return []
        return ["ttft", "tpot"] if c.tpot_s is not None else ["ttft"]

    def record_finished(self, class_name: str, f: FinishedRequestStats, predicted_ttft_s: float | None) -> None:
        ttft = f.queue_time + f.prefill_time
        self.ttft.labels(class_name).observe(ttft)
        tpot = f.decode_time / (f.num_generation_tokens - 1) if f.num_generation_tokens > 1 else None
        if tpot is not None:
            self.tpot.labels(class_name).observe(tpot)
        c = self._class(class_name)
        if c.ttft_s is not None:
            self.requests.labels(class_name, "ttft", RESULTS[ttft > c.ttft_s]).inc()
            if c.tpot_s is not None and tpot is not None:
                self.requests.labels(class_name, "tpot", RESULTS[tpot > c.tpot_s]).inc()
        if predicted_ttft_s is not None:
            error = predicted_ttft_s - ttft
            self.prediction_error.labels(class_name, "over" if error >= 0 else "under").observe(abs(error))


class AdmissionCollector(Collector):
    """Shed and demoted requests by class, from `Admission`'s counts at scrape time, and
    each class's targets."""

    def __init__(self, admission: Admission, slo_classes: SloClasses):
        self._admission = admission
        self._slo_classes = slo_classes

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        names = self._slo_classes.names
        shed = CounterMetricFamily(
            "inferd_slo_requests_shed",
            "Requests refused at admission, by class and reason (slo_unattainable: 429; "
            "max_num_queued_reqs, max_num_queued_tokens: 503 queue_full).",
            labels=["slo_class", "reason"],
        )
        counts = dict(self._admission.shed)
        for name in sorted({*names, *(c for c, _ in counts)}):
            for key, reason in SHED_REASONS.items():
                shed.add_metric([name, reason], counts.get((name, key), 0))
        yield shed
        demoted = CounterMetricFamily(
            "inferd_slo_requests_demoted",
            "Requests of an on_miss=demote class served as best effort: predicted past their deadline.",
            labels=["slo_class"],
        )
        for name in sorted({*names, *self._admission.demoted}):
            demoted.add_metric([name], self._admission.demoted.get(name, 0))
        yield demoted
        targets = GaugeMetricFamily(
            "inferd_slo_class_target_seconds",
            "Each configured SLO class's targets (a best-effort class has none).",
            labels=["slo_class", "target"],
        )
        for c in self._slo_classes.classes.values():
            for target, value in (("ttft", c.ttft_s), ("tpot", c.tpot_s)):
                if value is not None:
                    targets.add_metric([c.name, target], value)
        yield targets
