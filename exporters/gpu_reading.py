"""What the GPU collector reads: one `GpuSnapshot` per scrape, one `GpuReading` per GPU.

Every value is in NVML's own units (bytes, mW, mJ, MiB/s, percent) so a recording is a
faithful copy of what NVML said; the collector converts to dcgm-exporter's units. The
NVML metric and field ids the readings are keyed by live here too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from inferd.strict_fields import from_fields

# NVML GPM metric ids (nvmlGpmMetricId_t) -> reading key.
GPM_METRICS: dict[int, str] = {
    1: "graphics_util_pct",  # NVML_GPM_METRIC_GRAPHICS_UTIL: DCGM's GR_ENGINE_ACTIVE on Hopper
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
    FIELD_MEMORY_TEMP,
    FIELD_PCIE_REPLAY,
    FIELD_PCIE_REPLAY_ROLLOVER,
    FIELD_PCIE_L0_TO_RECOVERY,
    *PCIE_ERROR_FIELDS,
    FIELD_PCIE_TX_BYTES,
    FIELD_PCIE_RX_BYTES,
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
    # Health: nvmlClocksEventReasons bitmask, XIDs NVML reported since the previous read,
    # volatile uncorrected ECC errors, row remapping pending / failed (None: not offered).
    clocks_event_reasons: int | None = None
    xid_errors: list[int] = field(default_factory=list)
    ecc_uncorrected_volatile: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None

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
    def from_json(cls, data: dict[str, Any]) -> GpuReading:
        return from_fields(cls, data, "GPU reading key")


@dataclass(slots=True)
class GpuSnapshot:
    timestamp: float
    hostname: str
    driver_version: str
    gpus: list[GpuReading]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GpuSnapshot:
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
