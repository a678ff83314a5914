"""GPU back ends: where the GPU collector's readings come from.

A back end returns a `GpuSnapshot` per scrape: one `GpuReading` per GPU, every value
in NVML's own units (bytes, mW, mJ, MiB/s, percent) so a recording is a faithful copy
of what NVML said; the collector converts to dcgm-exporter's units.

- `NvmlBackend` reads NVML through nvidia-ml-py (`pynvml`). GPM metrics (Hopper and
  newer) need two samples an interval apart, so a background `GpmSampler` takes them
  and a scrape only reads the latest result instead of sleeping.
- `ReplayBackend` cycles through a recorded JSON file (`inferd gpu record`), for
  tests and for demos on machines without a GPU.

`open_backend("nvml")` / `open_backend("replay:PATH")` picks one from the CLI spec.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from exporters.registry import CollectorUnavailable, SourceAbsent

log = logging.getLogger(__name__)

REPLAY_FORMAT = "inferd-gpu-replay/1"

# NVML GPM metric ids (nvmlGpmMetricId_t) -> reading key.
GPM_METRICS: dict[int, str] = {
    2: "sm_util_pct",
    3: "sm_occupancy_pct",
    5: "any_tensor_util_pct",
    10: "dram_bw_util_pct",
    20: "pcie_tx_mib_s",
    21: "pcie_rx_mib_s",
}

# NVML field ids read with nvmlDeviceGetFieldValues; each value has its own return code.
FIELD_MEMORY_TEMP = 82
FIELD_PCIE_REPLAY = 94
FIELD_PCIE_REPLAY_ROLLOVER = 95
FIELD_PCIE_L0_TO_RECOVERY = 169
PCIE_ERROR_FIELDS: dict[int, str] = {
    173: "correctable",
    174: "naks_received",
    175: "receiver_error",
    176: "bad_tlp",
    177: "naks_sent",
    178: "bad_dllp",
    179: "nonfatal",
    180: "fatal",
    181: "unsupported_request",
    182: "lcrc",
}
FIELD_PCIE_LANE_ERRORS = 183  # one value per lane, lane number in scopeId
FIELD_PCIE_TX_BYTES = 197
FIELD_PCIE_RX_BYTES = 198
SCALAR_FIELDS = (
    FIELD_MEMORY_TEMP, FIELD_PCIE_REPLAY, FIELD_PCIE_REPLAY_ROLLOVER, FIELD_PCIE_L0_TO_RECOVERY,
    *PCIE_ERROR_FIELDS, FIELD_PCIE_TX_BYTES, FIELD_PCIE_RX_BYTES,
)


def field_key(field_id: int, scope_id: int | None = None) -> str:
    """JSON key of a field value: "94", or "183:3" for lane 3 of a scoped field."""
    return str(field_id) if scope_id is None else f"{field_id}:{scope_id}"


@dataclass(slots=True)
class GpuReading:
    """One GPU at one moment; None means NVML did not offer that value."""

    index: int
    uuid: str
    pci_bus_id: str
    minor_number: int
    name: str
    gpu_util_pct: float | None = None
    mem_copy_util_pct: float | None = None
    fb_used_bytes: int | None = None
    fb_free_bytes: int | None = None
    fb_reserved_bytes: int | None = None
    power_mw: float | None = None
    energy_mj: float | None = None
    gpu_temp_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    pcie_replay_counter: int | None = None
    # PCIe throughput from nvmlDeviceGetPcieThroughput (KB/s, 20 ms window); only read
    # when GPM is not available.
    pcie_tx_kb_s: float | None = None
    pcie_rx_kb_s: float | None = None
    # GPM results over the sampler's last interval, keyed by GPM_METRICS values, plus
    # "interval_s"; None when the GPU has no GPM or no interval has completed yet.
    gpm: dict[str, float] | None = None
    # Raw NVML field values by field_key(); absent when the field's return code failed.
    fields: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"GpuReading.index must be >= 0, got {self.index}")
        if not self.uuid:
            raise ValueError("GpuReading.uuid must not be empty")
        if self.gpm is not None:
            unknown = set(self.gpm) - set(GPM_METRICS.values()) - {"interval_s"}
            if unknown:
                raise ValueError(f"GpuReading.gpm has unknown keys {sorted(unknown)}")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "GpuReading":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"GPU reading has unknown keys {sorted(unknown)} (known: {sorted(known)})")
        return cls(**data)


@dataclass(slots=True)
class GpuSnapshot:
    timestamp: float
    hostname: str
    driver_version: str
    gpus: list[GpuReading]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "GpuSnapshot":
        known = {"timestamp", "hostname", "driver_version", "gpus"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"GPU snapshot has unknown keys {sorted(unknown)}")
        missing = known - set(data)
        if missing:
            raise ValueError(f"GPU snapshot lacks keys {sorted(missing)}")
        return cls(
            timestamp=float(data["timestamp"]),
            hostname=str(data["hostname"]),
            driver_version=str(data["driver_version"]),
            gpus=[GpuReading.from_json(g) for g in data["gpus"]],
        )


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


# ---------------------------------------------------------------------------- replay


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


# ---------------------------------------------------------------------------- NVML


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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


class NvmlBackend:
    """Live readings from NVML. Raises SourceAbsent on a host without NVML's library or
    without a GPU, CollectorUnavailable when NVML is there but fails to start."""

    def __init__(self, gpm_interval_s: float = 1.0, nvml: Any = None):
        if nvml is None:
            try:
                import pynvml as nvml  # nvidia-ml-py
            except ImportError as exc:
                raise SourceAbsent(f"nvidia-ml-py not installed: {exc}") from None
        self._nvml = nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:
            # No libnvidia-ml.so: no NVIDIA driver on this host, so no GPU to watch. A
            # driver that is installed but fails (not loaded, no permission) is a fault.
            absent = getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", object())
            raise (SourceAbsent if absent else CollectorUnavailable)(f"NVML not available: {exc}") from None
        try:
            self.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
            count = nvml.nvmlDeviceGetCount()
            if count == 0:
                nvml.nvmlShutdown()
                raise SourceAbsent("NVML sees no GPU on this host")
            self._handles = {i: nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)}
            self._identity = {i: self._read_identity(i, h) for i, h in self._handles.items()}
        except SourceAbsent:
            raise
        except Exception as exc:
            nvml.nvmlShutdown()
            raise CollectorUnavailable(f"NVML device enumeration failed: {exc}") from None
        self.hostname = socket.gethostname()
        gpm_handles = {i: h for i, h in self._handles.items() if self._gpm_supported(h)}
        self.gpm_indices = set(gpm_handles)
        self._sampler = GpmSampler(nvml, gpm_handles, gpm_interval_s) if gpm_handles else None
        if self._sampler:
            self._sampler.start()

    def _read_identity(self, index: int, handle: Any) -> dict[str, Any]:
        nvml = self._nvml
        return {
            "index": index,
            "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
            "pci_bus_id": _text(nvml.nvmlDeviceGetPciInfo(handle).busId),
            "minor_number": int(self._try(nvml.nvmlDeviceGetMinorNumber, handle, default=index)),
            "name": _text(nvml.nvmlDeviceGetName(handle)),
        }

    def _gpm_supported(self, handle: Any) -> bool:
        try:
            return bool(self._nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except Exception:
            return False

    @staticmethod
    def _try(fn, *args, default=None):
        try:
            return fn(*args)
        except Exception:
            return default

    def read(self) -> GpuSnapshot:
        return GpuSnapshot(
            timestamp=time.time(),
            hostname=self.hostname,
            driver_version=self.driver_version,
            gpus=[self._read_gpu(i, h) for i, h in self._handles.items()],
        )

    def _read_gpu(self, index: int, handle: Any) -> GpuReading:
        nvml, t = self._nvml, self._try
        reading = GpuReading(**self._identity[index])
        util = t(nvml.nvmlDeviceGetUtilizationRates, handle)
        if util is not None:
            reading.gpu_util_pct, reading.mem_copy_util_pct = float(util.gpu), float(util.memory)
        memory = t(nvml.nvmlDeviceGetMemoryInfo, handle, getattr(nvml, "nvmlMemory_v2", None))
        if memory is None:
            memory = t(nvml.nvmlDeviceGetMemoryInfo, handle)
        if memory is not None:
            reading.fb_used_bytes, reading.fb_free_bytes = int(memory.used), int(memory.free)
            reading.fb_reserved_bytes = int(getattr(memory, "reserved", 0))
        reading.power_mw = t(nvml.nvmlDeviceGetPowerUsage, handle)
        reading.energy_mj = t(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        reading.gpu_temp_c = t(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        reading.sm_clock_mhz = t(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
        reading.mem_clock_mhz = t(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM)
        reading.pcie_gen_current = t(nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle)
        reading.pcie_gen_max = t(nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle)
        reading.pcie_width_current = t(nvml.nvmlDeviceGetCurrPcieLinkWidth, handle)
        reading.pcie_width_max = t(nvml.nvmlDeviceGetMaxPcieLinkWidth, handle)
        reading.pcie_replay_counter = t(nvml.nvmlDeviceGetPcieReplayCounter, handle)
        if self._sampler and index in self.gpm_indices:
            reading.gpm = self._sampler.latest(index)
        else:
            reading.pcie_tx_kb_s = t(nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
            reading.pcie_rx_kb_s = t(nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
        reading.fields = self._read_fields(handle, reading.pcie_width_max or 16)
        return reading

    def _read_fields(self, handle: Any, num_lanes: int) -> dict[str, float]:
        nvml = self._nvml
        requests: list[Any] = list(SCALAR_FIELDS)
        requests += [(FIELD_PCIE_LANE_ERRORS, lane) for lane in range(num_lanes)]
        try:
            values = nvml.nvmlDeviceGetFieldValues(handle, requests)
        except Exception as exc:
            log.debug("nvmlDeviceGetFieldValues failed: %s", exc)
            return {}
        result: dict[str, float] = {}
        for request, value in zip(requests, values):
            if value.nvmlReturn != nvml.NVML_SUCCESS:
                continue  # this field is not offered by this GPU or driver
            if isinstance(request, tuple):
                key = field_key(*request)
            else:
                key = field_key(request)
            result[key] = _field_number(nvml, value)
        return result

    def close(self) -> None:
        if self._sampler:
            self._sampler.stop()
            self._sampler = None
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass


def _field_number(nvml: Any, value: Any) -> float:
    kind = value.valueType
    v = value.value
    if kind == nvml.NVML_VALUE_TYPE_DOUBLE:
        return float(v.dVal)
    member = {
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }.get(kind, "ullVal")
    return float(getattr(v, member))


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
