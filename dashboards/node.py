"""Node board: per GPU compute and memory activity, PCIe links, power and clocks."""

from __future__ import annotations

from .common import ANY_IS_BAD, GPU, HG, HOST, RATIO_BUSY, RATIO_IDLE_IS_BAD, H
from .spec import Board, Panel, Query, Row, Threshold

_per_gpu = "GPU {{gpu}}"

# PCIe bytes/s over the link's capacity in the same direction (width x per-lane rate).
_pcie_share = (
    "rate(inferd_pcie_{dir}_bytes_total{{{sel}}}[$__rate_interval])"
    " / on (host, gpu, pci_bus_id) group_left ()"
    " inferd_pcie_link_capacity_bytes_per_second{{{sel}}}"
)

compute = Row(
    "Compute",
    (
        Panel(
            "SM activity",
            "Share of time at least one warp was resident on a streaming multiprocessor, averaged over all SMs "
            "(DCGM_FI_PROF_SM_ACTIVE). Low activity while requests wait means the engine is not feeding the GPU.",
            "percentunit",
            (Query(f"DCGM_FI_PROF_SM_ACTIVE{{{HG}}}", _per_gpu),),
            thresholds=RATIO_IDLE_IS_BAD,
            min=0,
            max=1,
            requires="gpu",
            headline=True,
        ),
        Panel(
            "SM occupancy",
            "Resident warps over the maximum the SMs can hold (DCGM_FI_PROF_SM_OCCUPANCY). High occupancy with low "
            "DRAM bandwidth means compute-bound; falling occupancy with high DRAM bandwidth means the memory wall.",
            "percentunit",
            (Query(f"DCGM_FI_PROF_SM_OCCUPANCY{{{HG}}}", _per_gpu),),
            thresholds=RATIO_IDLE_IS_BAD,
            min=0,
            max=1,
            requires="gpu",
        ),
        Panel(
            "Tensor core activity",
            "Share of cycles the tensor (HMMA/IMMA) pipes were busy (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE).",
            "percentunit",
            (Query(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{HG}}}", _per_gpu),),
            min=0,
            max=1,
            requires="gpu",
        ),
        Panel(
            "DRAM bandwidth utilisation",
            "Share of cycles the device memory interface was busy sending or receiving data "
            "(DCGM_FI_PROF_DRAM_ACTIVE): how saturated HBM is. Decode is bandwidth bound, so near 1 is the ceiling.",
            "percentunit",
            (Query(f"DCGM_FI_PROF_DRAM_ACTIVE{{{HG}}}", _per_gpu),),
            thresholds=RATIO_BUSY,
            min=0,
            max=1,
            requires="gpu",
            headline=True,
        ),
        Panel(
            "GPU utilisation",
            "Share of the sample period a kernel was running (DCGM_FI_DEV_GPU_UTIL, percent). Coarser than SM activity: "
            "one small kernel counts as busy.",
            "percent",
            (Query(f"DCGM_FI_DEV_GPU_UTIL{{{HG}}}", _per_gpu),),
            min=0,
            max=100,
            requires="gpu",
        ),
        Panel(
            "Framebuffer memory used",
            "Device memory in use (DCGM_FI_DEV_FB_USED, MiB): weights, KV cache and activations.",
            "decmbytes",
            (Query(f"DCGM_FI_DEV_FB_USED{{{HG}}}", _per_gpu),),
            requires="gpu",
        ),
    ),
)


def _pcie_share_heatmap(direction: str, title: str, description: str) -> Panel:
    return Panel(
        title,
        description,
        "percentunit",
        (Query(_pcie_share.format(dir=direction, sel=HG), _per_gpu),),
        kind="heatmap",
        thresholds=RATIO_BUSY,
        min=0,
        max=1,
        width=12,
        requires="pcie-sysfs",  # the capacity comes from sysfs, the bytes from NVML
    )


pcie = Row(
    "PCIe",
    (
        _pcie_share_heatmap(
            "tx",
            "PCIe TX share of link capacity",
            "Device-to-host bytes per second over the link's capacity in that direction (current width x per-lane "
            "rate of the trained generation), one row per GPU. Near 1 the link is the bottleneck for KV swap-out.",
        ),
        _pcie_share_heatmap(
            "rx",
            "PCIe RX share of link capacity",
            "Host-to-device bytes per second over the link's capacity, one row per GPU. Near 1 the link limits "
            "KV swap-in and weight loading.",
        ),
        Panel(
            "PCIe throughput",
            "Bytes per second each way, from NVML's cumulative counters (inferd_pcie_*_bytes_total), "
            "with the link's capacity per direction for scale.",
            "Bps",
            (
                Query(f"rate(inferd_pcie_tx_bytes_total{{{HG}}}[$__rate_interval])", "GPU {{gpu}} TX"),
                Query(f"rate(inferd_pcie_rx_bytes_total{{{HG}}}[$__rate_interval])", "GPU {{gpu}} RX"),
                Query(f"inferd_pcie_link_capacity_bytes_per_second{{{HG}}}", "GPU {{gpu}} capacity"),
            ),
            requires="gpu",
            headline=True,
        ),
        Panel(
            "Link width per hop",
            "Trained (current) and maximum lane count on every hop from the GPU (hop 0) up to the root port. "
            "A current width below the maximum caps host-device bandwidth.",
            "short",
            (
                Query(f'inferd_pcie_link_width{{{HG}, kind="current"}}', "GPU {{gpu}} hop {{hop}} {{device}} current"),
                Query(f'inferd_pcie_link_width{{{HG}, kind="max"}}', "GPU {{gpu}} hop {{hop}} {{device}} max"),
            ),
            requires="pcie-sysfs",
        ),
        Panel(
            "Link speed per hop",
            "Trained (current) and maximum transfer rate per lane in GT/s on every hop: 2.5, 5, 8, 16, 32 for "
            "generations 1 to 5. Idle links may train down to save power; compare under load.",
            "short",
            (
                Query(
                    f'inferd_pcie_link_speed_gts{{{HG}, kind="current"}}', "GPU {{gpu}} hop {{hop}} {{device}} current"
                ),
                Query(f'inferd_pcie_link_speed_gts{{{HG}, kind="max"}}', "GPU {{gpu}} hop {{hop}} {{device}} max"),
            ),
            requires="pcie-sysfs",
        ),
        Panel(
            "Degraded hops",
            "1 where a hop on the GPU's path trained below its maximum width or generation "
            "(inferd_pcie_link_degraded); red rows are the links to reseat or check.",
            "short",
            (Query(f"inferd_pcie_link_degraded{{{HG}}}", "GPU {{gpu}} hop {{hop}} {{device}}"),),
            kind="state-timeline",
            thresholds=(Threshold(None, "green"), Threshold(1, "red")),
            value_names=((0, "ok"), (1, "degraded")),
            requires="pcie-sysfs",
        ),
        Panel(
            "AER errors",
            "Advanced Error Reporting counts per device on the GPUs' paths, by severity and error type, "
            "per rate interval. Correctable errors in bursts precede link retraining.",
            "short",
            (
                Query(
                    f"sum by (device, severity, error) (increase(inferd_pcie_aer_errors_total{{{H}}}[$__rate_interval]))",
                    "{{device}} {{severity}} {{error}}",
                ),
            ),
            thresholds=ANY_IS_BAD,
            requires="aer",
        ),
        Panel(
            "Replays and recoveries",
            "PCIe replays (a TLP resent after a bad LCRC or a NAK), replay-counter rollovers and L0-to-recovery "
            "transitions, per rate interval. Rising replays mean a marginal link.",
            "short",
            (
                Query(f"increase(inferd_pcie_replay_total{{{HG}}}[$__rate_interval])", "GPU {{gpu}} replay"),
                Query(f"increase(inferd_pcie_replay_rollover_total{{{HG}}}[$__rate_interval])", "GPU {{gpu}} rollover"),
                Query(f"increase(inferd_pcie_l0_recovery_total{{{HG}}}[$__rate_interval])", "GPU {{gpu}} L0 recovery"),
            ),
            thresholds=ANY_IS_BAD,
            requires="gpu",
        ),
        Panel(
            "Link errors by type",
            "NVML's PCIe error counters (correctable, NAKs, receiver, bad TLP/DLLP, LCRC, ...) per rate interval.",
            "short",
            (
                Query(
                    f"sum by (gpu, type) (increase(inferd_pcie_link_errors_total{{{HG}}}[$__rate_interval]))",
                    "GPU {{gpu}} {{type}}",
                ),
            ),
            thresholds=ANY_IS_BAD,
            requires="gpu",
        ),
        Panel(
            "Lane errors",
            "Errors per PCIe lane per rate interval, one row per GPU and lane; a single hot lane points at a "
            "connector or riser.",
            "short",
            (
                Query(
                    f"sum by (gpu, lane) (increase(inferd_pcie_lane_errors_total{{{HG}}}[$__rate_interval]))",
                    "GPU {{gpu}} lane {{lane}}",
                ),
            ),
            kind="heatmap",
            thresholds=ANY_IS_BAD,
            requires="gpu",
        ),
    ),
)

power = Row(
    "Power and clocks",
    (
        Panel(
            "Power draw",
            "Board power in watts (DCGM_FI_DEV_POWER_USAGE).",
            "watt",
            (Query(f"DCGM_FI_DEV_POWER_USAGE{{{HG}}}", _per_gpu),),
            requires="gpu",
            headline=True,
        ),
        Panel(
            "Temperature",
            "GPU die temperature in degrees Celsius (DCGM_FI_DEV_GPU_TEMP); clocks throttle near the slowdown limit.",
            "celsius",
            (Query(f"DCGM_FI_DEV_GPU_TEMP{{{HG}}}", _per_gpu),),
            thresholds=(Threshold(None, "green"), Threshold(80, "orange"), Threshold(90, "red")),
            requires="gpu",
        ),
        Panel(
            "SM clock",
            "Streaming-multiprocessor clock (DCGM_FI_DEV_SM_CLOCK, reported in MHz). A drop under load means "
            "power or thermal throttling.",
            "hertz",
            (Query(f"DCGM_FI_DEV_SM_CLOCK{{{HG}}} * 1000000", _per_gpu),),
            requires="gpu",
        ),
        Panel(
            "Memory clock",
            "Device memory clock (DCGM_FI_DEV_MEM_CLOCK, reported in MHz).",
            "hertz",
            (Query(f"DCGM_FI_DEV_MEM_CLOCK{{{HG}}} * 1000000", _per_gpu),),
            requires="gpu",
        ),
    ),
)

collectors = Row(
    "Agent",
    (
        Panel(
            "Collectors up",
            "1 when the collector read its source on the last scrape (inferd_collector_up); the agent log says why "
            "one is down.",
            "short",
            (Query(f"inferd_collector_up{{{H}}}", "{{collector}}"),),
            kind="state-timeline",
            thresholds=(Threshold(None, "red"), Threshold(1, "green")),
            value_names=((0, "down"), (1, "up")),
        ),
        Panel(
            "Collector duration",
            "Time each collector took on the last scrape (inferd_collector_duration_seconds).",
            "s",
            (Query(f"inferd_collector_duration_seconds{{{H}}}", "{{collector}}"),),
            thresholds=(Threshold(None, "green"), Threshold(0.1, "orange"), Threshold(1, "red")),
        ),
    ),
)

BOARD = Board(
    uid="inferd-node",
    title="inferd / Node",
    description="Per GPU compute and memory activity, PCIe links and errors, power and clocks.",
    rows=(compute, pcie, power, collectors),
    variables=(HOST, GPU),
)
