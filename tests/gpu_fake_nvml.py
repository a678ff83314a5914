"""A stand-in for `pynvml` that answers like one Hopper GPU, for back-end tests on CPU.

Structures and constants are the real ones from nvidia-ml-py, so the back end's
ctypes handling is exercised; only the C calls are replaced. `unsupported_fields`
lists field ids whose per-value return code is NOT_SUPPORTED.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pynvml as real


class FakeNvml:
    def __init__(self, num_gpus: int = 1, gpm: bool = True, unsupported_fields=(), fail_init: bool = False):
        self.num_gpus = num_gpus
        self.gpm = gpm
        self.unsupported_fields = set(unsupported_fields)
        self.fail_init = fail_init
        self.sample_counter = itertools.count()
        self.initialised = False
        self.freed_samples = 0
        self.clock_reasons: dict[int, int] = {}
        self.ecc_uncorrected: dict[int, int] = {}
        self.remapped_rows: dict[int, tuple[int, int, int, int]] = {}  # corrected, uncorrected, pending, failed
        self.pending_xids: dict[int, list[int]] = {}

    def __getattr__(self, name):  # constants and structures come from nvidia-ml-py
        return getattr(real, name)

    def nvmlInit(self):
        if self.fail_init:
            raise real.NVMLError(real.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialised = True

    def nvmlShutdown(self):
        self.initialised = False

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlDeviceGetCount(self):
        return self.num_gpus

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-0000000{h}-fake-uuid"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode())

    def nvmlDeviceGetMinorNumber(self, h):
        return h

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"

    def nvmlGpmQueryDeviceSupport(self, h):
        return SimpleNamespace(isSupportedDevice=int(self.gpm))

    def nvmlGpmSampleAlloc(self):
        next(self.sample_counter)
        return real.c_nvmlGpmSample_t()  # a null handle of the real type

    def nvmlGpmSampleFree(self, sample):
        self.freed_samples += 1

    def nvmlGpmSampleGet(self, h, sample):
        return sample

    def nvmlGpmMetricsGet(self, request):
        values = {1: 96.0, 2: 78.0, 3: 11.5, 5: 75.75, 10: 14.35, 20: 0.5, 21: 2.5}
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            metric.value = values[metric.metricId]
            metric.nvmlReturn = real.NVML_SUCCESS
        return request

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        mib = 1024 * 1024
        return SimpleNamespace(used=1000 * mib + 5, free=140000 * mib, reserved=771 * mib, total=141771 * mib)

    def nvmlDeviceGetPowerUsage(self, h):
        return 512345

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return 123456789

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 41

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 1980 if clock == real.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return 1

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        return 2048 if counter == real.NVML_PCIE_UTIL_TX_BYTES else 4096

    def nvmlDeviceGetFieldValues(self, h, requests):
        values = (real.c_nvmlFieldValue_t * len(requests))()
        for i, request in enumerate(requests):
            field_id, scope = request if isinstance(request, tuple) else (request, 0)
            values[i].fieldId, values[i].scopeId = field_id, scope
            if field_id in self.unsupported_fields:
                values[i].nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
                continue
            values[i].nvmlReturn = real.NVML_SUCCESS
            values[i].valueType = real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            values[i].value.ullVal = field_id * 10 + scope
        return values

    # health: clock event reasons, ECC, row remapping and XID events, set per GPU by tests
    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.clock_reasons.get(h, 0)

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        return self.ecc_uncorrected.get(h, 0)

    def nvmlDeviceGetRemappedRows(self, h):
        return self.remapped_rows.get(h, (0, 0, 0, 0))

    def nvmlEventSetCreate(self):
        return SimpleNamespace(handles=[])

    def nvmlDeviceRegisterEvents(self, h, event_types, event_set):
        event_set.handles.append(h)

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        for h in event_set.handles:
            if self.pending_xids.get(h):
                return SimpleNamespace(
                    device=h, eventType=real.nvmlEventTypeXidCriticalError, eventData=self.pending_xids[h].pop(0)
                )
        raise real.NVMLError(real.NVML_ERROR_TIMEOUT)
