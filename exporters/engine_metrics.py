"""Read the engine's own /metrics (port 8000) for the agent's decisions and for OTLP.

The engine exports its KV paging and scheduler metrics on its own port, where
Prometheus scrapes them. The agent must not repeat them on port 10400 (that would
double every series in Prometheus), so `EngineMetricsReader` is *not* a collector in
the agent's CollectorSet: it is a source for the OTLP push and for code that decides
(remediation), and `values()` gives the latest readings by sample name.
"""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from inferd.exporters.registry import CollectorUnavailable

log = logging.getLogger(__name__)

# Engine families the agent forwards and decides on (docs/METRICS.md, engine port).
KV_FAMILIES = (
    "inferd_kv_page_faults",
    "inferd_kv_swap_bytes",
    "inferd_kv_blocks",
    "inferd_kv_fragmentation_ratio",
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions",
)


@dataclass(slots=True)
class EngineMetricsConfig:
    url: str = "http://127.0.0.1:8000/metrics"
    timeout_s: float = 1.0
    families: tuple[str, ...] = KV_FAMILIES

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"engine metrics URL must be http(s)://..., got {self.url!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


def parse_engine_metrics(text: str, families: Iterable[str]) -> list[Metric]:
    """The named families from an exposition text (counter names without `_total`)."""
    wanted = set(families)
    return [family for family in text_string_to_metric_families(text) if family.name in wanted]


def sample_values(families: Iterable[Metric]) -> dict[str, float]:
    """`name{label="v",...}` -> value, labels sorted, for decisions and tests."""
    values = {}
    for family in families:
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


class EngineMetricsReader:
    """Fetches the engine's /metrics on demand; keeps the last good reading."""

    def __init__(self, config: EngineMetricsConfig | None = None):
        self.config = config or EngineMetricsConfig()
        self._last: list[Metric] = []
        self._lock = threading.Lock()

    def read(self) -> list[Metric]:
        try:
            with urllib.request.urlopen(self.config.url, timeout=self.config.timeout_s) as response:
                text = response.read().decode()
        except (urllib.error.URLError, OSError) as exc:
            raise CollectorUnavailable(f"engine metrics at {self.config.url} unreachable: {exc}") from None
        families = parse_engine_metrics(text, self.config.families)
        with self._lock:
            self._last = families
        return families

    def values(self) -> dict[str, float]:
        with self._lock:
            return sample_values(self._last)
