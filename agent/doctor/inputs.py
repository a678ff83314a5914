"""What the checks read, gathered once per run: the agent's and the engine's /metrics,
the engine's admin config and model, Prometheus range queries over the window, the
sysfs/procfs roots (topology, the engine's process) and the GPU back end.

A source that cannot be read leaves its field None and its reason in `missing`, so a
check that needs it skips and says why. Prometheus queries run when a check asks and
are kept, so two checks asking the same thing cost one query.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from inferd.agent.engine_client import token_from
from inferd.agent.prometheus import PrometheusClient
from inferd.agent.topology import Topology

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """`15m`, `90s`, `2h`, `1d` -> seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"bad duration {text!r}: expected a number and s, m, h or d, like 15m")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"duration {text!r} must be > 0")
    return seconds


@dataclass(frozen=True, slots=True)
class DoctorOptions:
    agent_url: str | None = None
    engine_url: str | None = None
    prometheus_url: str | None = None
    since_s: float = 900.0
    active: bool = False
    only: tuple[str, ...] = ()
    sysfs_root: str = "/sys"
    procfs_root: str = "/proc"
    gpu_backend: str | None = "nvml"
    engine_pid: int | None = None
    admin_token_file: str | None = None
    sweep_path: str | None = None
    # (agent|engine|prometheus, where its URL came from or what was tried), when the doctor looked
    found: tuple[tuple[str, str], ...] = ()
    gpu_reads: int = 3  # live NVML reads, `gpu_read_interval_s` apart (a replay gives all of its own)
    gpu_read_interval_s: float = 0.5
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("agent_url", "engine_url", "prometheus_url"):
            url = getattr(self, name)
            if url is not None and not url.startswith(("http://", "https://")):
                raise ValueError(f"--{name.removesuffix('_url')} must be an http(s) URL, got {url!r}")
        if not self.since_s > 0:
            raise ValueError(f"--since must be > 0 seconds, got {self.since_s}")
        if self.gpu_reads < 1:
            raise ValueError(f"gpu_reads must be >= 1, got {self.gpu_reads}")
        if self.gpu_read_interval_s < 0 or self.timeout_s <= 0:
            raise ValueError("gpu_read_interval_s must be >= 0 and timeout_s > 0")
        if self.engine_pid is not None and self.engine_pid <= 0:
            raise ValueError(f"--engine-pid must be a positive pid, got {self.engine_pid}")


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


class Samples:
    """The samples of one exposition text, looked up by name and labels."""

    def __init__(self, text: str, source: str):
        self.source = source
        self.samples = [
            Sample(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]

    def all(self, name: str, **labels: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    def value(self, name: str, **labels: str) -> float | None:
        """The sum over the matching samples; None when there is none."""
        found = self.all(name, **labels)
        return sum(s.value for s in found) if found else None

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.samples)


@dataclass(frozen=True, slots=True)
class RangeSeries:
    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]  # (unix time, value), NaN dropped

    @property
    def values(self) -> list[float]:
        return [v for _, v in self.points]


class Prometheus:
    """Range queries over the doctor's window [now - since, now], kept by expression."""

    def __init__(self, url: str, start: float, end: float, step_s: float, timeout_s: float = 10.0):
        self.url, self.start, self.end, self.step_s, self.timeout_s = url, start, end, step_s, timeout_s
        self._client = PrometheusClient(url, timeout_s)
        self._cache: dict[str, list[RangeSeries]] = {}

    def range(self, expr: str) -> list[RangeSeries]:
        if expr not in self._cache:
            result = self._client.query_range(expr, self.start, self.end, self.step_s)
            series = []
            for item in result:
                points = tuple((float(t), float(v)) for t, v in item.get("values", []) if not math.isnan(float(v)))
                series.append(RangeSeries(dict(item.get("metric", {})), points))
            self._cache[expr] = series
        return self._cache[expr]

    def source(self, expr: str) -> str:
        return f"prometheus:{expr}"

    @property
    def window(self) -> str:
        """The window as a PromQL range, e.g. `900s`."""
        return f"{int(round(self.end - self.start))}s"


@dataclass(slots=True)
class Inputs:
    options: DoctorOptions
    now: float
    agent: Samples | None = None
    engine: Samples | None = None
    engine_config: dict[str, Any] | None = None  # GET /admin/config: config, bounds, path, path_reason
    engine_model: dict[str, Any] | None = None  # /v1/models data[0]: id, max_model_len
    prometheus: Prometheus | None = None
    topology: Topology | None = None
    gpu_snapshots: list[Any] = field(default_factory=list)  # exporters.gpu_reading.GpuSnapshot
    gpu_source: str = ""
    engine_pid: int | None = None
    sweep: dict[str, Any] | None = None
    missing: dict[str, str] = field(default_factory=dict)

    def why(self, name: str) -> str:
        return self.missing.get(name, f"no {name} given")

    @property
    def sysfs(self) -> Path:
        return Path(self.options.sysfs_root)

    @property
    def procfs(self) -> Path:
        return Path(self.options.procfs_root)

    def prometheus_reason(self) -> str:
        return self.missing.get("prometheus", "no --prometheus given: instant values only")


def _get(url: str, timeout_s: float, token: str | None = None) -> bytes:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return response.read()


def _reason(what: str, url: str, exc: Exception) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        detail = exc.read().decode(errors="replace")[:200]
        return f"{what} at {url} answered HTTP {exc.code}: {detail}"
    if isinstance(exc, urllib.error.URLError):
        return f"{what} at {url} unreachable: {exc.reason}"
    return f"{what} at {url} unreadable: {exc}"


def _not_given(options: DoctorOptions, name: str, default: str) -> str:
    """Why an endpoint is missing: what the doctor tried to find it, else `default`."""
    return dict(options.found).get(name, default)


def gather(options: DoctorOptions, now: float | None = None) -> Inputs:
    inputs = Inputs(options=options, now=time.time() if now is None else now)
    _gather_agent(inputs)
    _gather_engine(inputs)
    _gather_prometheus(inputs)
    _gather_topology(inputs)
    _gather_gpu(inputs)
    _gather_engine_pid(inputs)
    _gather_sweep(inputs)
    return inputs


def _gather_agent(inputs: Inputs) -> None:
    url = inputs.options.agent_url
    if url is None:
        inputs.missing["agent"] = _not_given(inputs.options, "agent", "no --agent given")
        return
    metrics_url = f"{url.rstrip('/')}/metrics"
    try:
        inputs.agent = Samples(_get(metrics_url, inputs.options.timeout_s).decode(), f"agent:{metrics_url}")
    except (OSError, ValueError) as exc:
        inputs.missing["agent"] = _reason("the agent's /metrics", metrics_url, exc)


def _gather_engine(inputs: Inputs) -> None:
    url = inputs.options.engine_url
    if url is None:
        for name in ("engine", "engine_config", "engine_model"):
            inputs.missing[name] = _not_given(inputs.options, "engine", "no --engine given")
        return
    base = url.rstrip("/")
    timeout = inputs.options.timeout_s
    try:
        inputs.engine = Samples(_get(f"{base}/metrics", timeout).decode(), f"engine:{base}/metrics")
    except (OSError, ValueError) as exc:
        inputs.missing["engine"] = _reason("the engine's /metrics", f"{base}/metrics", exc)
    try:
        models = json.loads(_get(f"{base}/v1/models", timeout))
        inputs.engine_model = models["data"][0]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        inputs.missing["engine_model"] = _reason("the engine's /v1/models", f"{base}/v1/models", exc)
    try:
        token = token_from(path=inputs.options.admin_token_file)
    except (OSError, ValueError) as exc:
        inputs.missing["engine_config"] = f"admin token unreadable: {exc}"
        return
    if token is None:
        inputs.missing["engine_config"] = "no admin token (INFERD_ADMIN_TOKEN or --admin-token-file)"
        return
    try:
        body = json.loads(_get(f"{base}/admin/config", timeout, token))
        if not isinstance(body, dict) or not isinstance(body.get("config"), dict):
            raise ValueError(f"not an admin config body: {str(body)[:200]}")
        inputs.engine_config = body
    except (OSError, ValueError) as exc:
        inputs.missing["engine_config"] = _reason("the engine's /admin/config", f"{base}/admin/config", exc)


def _gather_prometheus(inputs: Inputs) -> None:
    url = inputs.options.prometheus_url
    if url is None:
        reason = _not_given(inputs.options, "prometheus", "no --prometheus given")
        inputs.missing["prometheus"] = f"{reason}: instant values only"
        return
    since = inputs.options.since_s
    # about 120 points over the window, none closer than 5 s
    step = max(5.0, round(since / 120))
    prometheus = Prometheus(url, inputs.now - since, inputs.now, step, inputs.options.timeout_s)
    try:
        prometheus.range("vector(1)")
    except (OSError, RuntimeError, ValueError) as exc:
        inputs.missing["prometheus"] = f"Prometheus at {url} unusable: {exc}"
        return
    inputs.prometheus = prometheus


def _gather_topology(inputs: Inputs) -> None:
    from inferd.agent.topology import discover

    try:
        inputs.topology = discover(inputs.options.sysfs_root)
    except FileNotFoundError as exc:
        inputs.missing["topology"] = f"no PCI devices under --sysfs-root {inputs.options.sysfs_root}: {exc}"
    except ValueError as exc:
        inputs.missing["topology"] = f"malformed sysfs data under {inputs.options.sysfs_root}: {exc}"
    else:
        if not inputs.topology.gpus:
            inputs.missing["gpus"] = f"no NVIDIA GPU under {inputs.options.sysfs_root}/bus/pci/devices"


def _gather_gpu(inputs: Inputs) -> None:
    from inferd.exporters.gpu_backends import open_backend
    from inferd.exporters.gpu_replay import ReplayBackend
    from inferd.exporters.registry import CollectorUnavailable

    spec = inputs.options.gpu_backend
    if spec is None:
        inputs.missing["gpu_backend"] = "no GPU back end given"
        return
    inputs.gpu_source = "nvml" if spec == "nvml" else spec
    try:
        backend = open_backend(spec)
    except (CollectorUnavailable, ValueError) as exc:
        inputs.missing["gpu_backend"] = f"GPU back end {spec}: {exc}"
        return
    try:
        if isinstance(backend, ReplayBackend):
            inputs.gpu_snapshots = list(backend.snapshots)
        else:
            for i in range(inputs.options.gpu_reads):
                if i:
                    time.sleep(inputs.options.gpu_read_interval_s)
                inputs.gpu_snapshots.append(backend.read())
    except CollectorUnavailable as exc:
        inputs.missing["gpu_backend"] = f"GPU back end {spec}: {exc}"
    finally:
        backend.close()


def _gather_engine_pid(inputs: Inputs) -> None:
    if inputs.options.engine_pid is not None:
        inputs.engine_pid = inputs.options.engine_pid
        return
    if inputs.agent is not None:
        # the agent's NUMA collector labels the engine's pages with its pid
        for sample in inputs.agent.all("inferd_numa_process_resident_pages"):
            if sample.labels.get("pid", "").isdigit():
                inputs.engine_pid = int(sample.labels["pid"])
                return
    inputs.missing["engine_pid"] = (
        "engine pid unknown: give --engine-pid, or --agent of an agent that supervises the engine"
    )


def _gather_sweep(inputs: Inputs) -> None:
    path = inputs.options.sweep_path
    if path is None:
        inputs.missing["sweep"] = "no --sweep file (an `inferd bench serve` result) given"
        return
    try:
        inputs.sweep = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        inputs.missing["sweep"] = f"sweep file {path} unreadable: {exc}"
