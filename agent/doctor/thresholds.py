"""Every threshold `inferd doctor` judges by, in one place (docs/DOCTOR.md lists them).

Ratios are 0-1, rates per second, sizes in bytes. A finding names the threshold it
crossed in its summary, so a reader can find it here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

# Peak DRAM bandwidth by GPU model name (NVML's name), bytes/s: the datasheet figures
# the copy and MBU shares are taken against.
GPU_PEAK_DRAM_BYTES_PER_SECOND: dict[str, float] = {
    "NVIDIA H200": 4.8e12,
    "NVIDIA H100 80GB HBM3": 3.35e12,
    "NVIDIA H100 PCIe": 2.0e12,
    "NVIDIA A100-SXM4-80GB": 2.039e12,
    "NVIDIA A100-SXM4-40GB": 1.555e12,
    "NVIDIA A100 80GB PCIe": 1.935e12,
    "NVIDIA L40S": 0.864e12,
}

# nvmlClocksEventReasons bits -> name; the ones the doctor reports. Idle (0x1) and
# application clocks (0x2) are the driver's normal choices, not throttling.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}
HARDWARE_CLOCK_REASONS = frozenset({"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"})
# XIDs that mean the GPU or its memory needs a reset or a replacement (NVIDIA's XID catalogue).
CRITICAL_XIDS = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})


@dataclass(frozen=True, slots=True)
class Thresholds:
    # placement: share of the engine's allowed CPUs off its GPUs' node, and of its resident pages
    placement_cpu_remote_fail: float = 0.5  # most of its CPUs on the far socket
    placement_memory_remote_warn: float = 0.10
    placement_memory_remote_fail: float = 0.50
    # pcie: the path's bottleneck against the GPU's own link ceiling
    pcie_bottleneck_fail: float = 0.75  # an x8 hop under an x16 GPU is 0.5
    pcie_shared_busy: float = 0.80  # GPUs behind one upstream link moving this share of it at once
    pcie_correctable_per_minute_warn: float = 1.0
    pcie_replays_per_minute_warn: float = 1.0
    pcie_min_read_request_bytes: int = 512
    # copy bandwidth (--active): measured share of the ceiling
    copy_share_warn: float = 0.80
    copy_share_fail: float = 0.50
    # GPU health: share of samples with a throttle reason
    throttle_share_warn: float = 0.05
    # engine
    regime_busy: float = 0.60  # SM or DRAM active at or above this is busy
    regime_idle: float = 0.20  # both below this with requests queued: host-bound
    mbu_warn: float = 0.50
    # KV cache
    kv_faults_per_second_warn: float = 0.1
    kv_faults_per_second_fail: float = 1.0
    kv_usage_thrash: float = 0.90
    kv_fragmentation_warn: float = 0.30
    fit_min_points: int = 6
    fit_r2_min: float = 0.5
    # saturation
    knee_load_warn: float = 0.90  # current load against the knee
    knee_load_fail: float = 1.0
    latency_jump: float = 2.0  # p99 at the knee's next level over p99 at the knee
    headroom_step_slo_seconds: float = 0.1  # decode step (inter-token) latency the node must keep
    headroom_min_points: int = 3
    # configuration
    kv_tokens_per_seq_min_share: float = 0.25  # KV tokens per max_num_seqs slot against max_model_len
    swap_hugepages_min_bytes: int = 1 << 30  # swap pools past this want huge pages

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"threshold {f.name} must be a number >= 0, got {value!r}")
        for name in ("placement_memory_remote_warn", "placement_memory_remote_fail", "pcie_bottleneck_fail"):
            if getattr(self, name) > 1:
                raise ValueError(f"threshold {name} is a share and must be <= 1, got {getattr(self, name)}")
        if self.placement_memory_remote_warn > self.placement_memory_remote_fail:
            raise ValueError("placement_memory_remote_warn must not exceed placement_memory_remote_fail")
        if self.copy_share_fail > self.copy_share_warn:
            raise ValueError("copy_share_fail must not exceed copy_share_warn")
        if self.kv_faults_per_second_warn > self.kv_faults_per_second_fail:
            raise ValueError("kv_faults_per_second_warn must not exceed kv_faults_per_second_fail")
        if self.fit_min_points < 3:
            raise ValueError(f"fit_min_points must be >= 3 (two parameters and a residual), got {self.fit_min_points}")


DEFAULT = Thresholds()
