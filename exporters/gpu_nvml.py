"""The NVML back end: live readings through nvidia-ml-py (`pynvml`), GPM through a
background `GpmSampler`, PCIe counters through field values (each with its own return code)."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

from inferd.exporters.gpu_gpm import GpmSampler
from inferd.exporters.gpu_reading import FIELD_PCIE_LANE_ERRORS, SCALAR_FIELDS, GpuReading, GpuSnapshot, field_key
from inferd.exporters.registry import CollectorUnavailable, SourceAbsent

log = logging.getLogger(__name__)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """Live readings from NVML. Raises SourceAbsent on a host without NVML's library or
    without a GPU, CollectorUnavailable when NVML is there but fails to start."""

    def __init__(self, gpm_interval_s: float = 1.0, nvml: Any = None):
        if nvml is None:
            try:
                import pynvml  # nvidia-ml-py
            except ImportError as exc:
                raise SourceAbsent(f"nvidia-ml-py not installed: {exc}") from None
            nvml = pynvml
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
        self._xid_sets: dict[int, Any] = {}
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
        self._read_health(index, handle, reading)
        return reading

    def _read_health(self, index: int, handle: Any, reading: GpuReading) -> None:
        nvml, t = self._nvml, self._try
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        reading.clocks_event_reasons = t(reasons, handle) if reasons is not None else None
        reading.ecc_uncorrected_volatile = t(
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
            getattr(nvml, "NVML_VOLATILE_ECC", 0),
        )
        remapped = t(nvml.nvmlDeviceGetRemappedRows, handle)
        if remapped is not None:
            reading.remapped_rows_pending, reading.remapped_rows_failure = bool(remapped[2]), bool(remapped[3])
        reading.xid_errors = self._pending_xids(index, handle)

    def _pending_xids(self, index: int, handle: Any) -> list[int]:
        """XIDs since the previous read: an event set per GPU, registered on first use
        (NVML reports an XID only to sets that existed when it happened), drained without waiting."""
        nvml = self._nvml
        sets = self._xid_sets
        if index not in sets:
            try:
                event_set = nvml.nvmlEventSetCreate()
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
                sets[index] = event_set
            except Exception as exc:
                log.debug("GPU %d: XID events unavailable: %s", index, exc)
                sets[index] = None
        event_set = sets[index]
        xids: list[int] = []
        while event_set is not None and len(xids) < 64:
            try:
                event = nvml.nvmlEventSetWait_v2(event_set, 0)
            except Exception:  # NVML_ERROR_TIMEOUT: nothing pending
                break
            xids.append(int(event.eventData))
        return xids

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
