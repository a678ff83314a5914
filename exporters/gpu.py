"""GPU collector: dcgm-exporter's names, labels and units, from a GPU back end.

Families follow dcgm-exporter's default counters (etc/default-counters.csv and
dcp-metrics-included.csv), so its dashboards work unchanged:

- DCGM_FI_PROF_* are ratios 0..1 (GPM reports percent) and PCIe rates are bytes/s
  (GPM reports MiB/s), as DCGM computes them. They come from GPM on Hopper and newer;
  elsewhere only the PCIe rates are filled in (nvmlDeviceGetPcieThroughput) and
  DCGM_FI_DEV_GPU_UTIL / DCGM_FI_DEV_MEM_COPY_UTIL carry plain utilisation.
- DCGM_FI_DEV_FB_* are MiB, power W, energy mJ, clocks MHz, temperatures C.
- Labels: gpu, UUID, pci_bus_id, device (nvidiaN), modelName, Hostname,
  DCGM_FI_DRIVER_VERSION, as dcgm-exporter 4.x emits them. Its main branch renames
  Hostname to hostname; --dcgm-host-label picks (default: the released Hostname).
- DCGM_FI_PROF_GR_ENGINE_ACTIVE is GPM's graphics-engine utilisation
  (NVML_GPM_METRIC_GRAPHICS_UTIL, what DCGM reads on Hopper); without GPM, or in a
  recording made before the agent read it, NVML's utilization.gpu (the share of time a
  kernel ran, the same engine-busy signal at NVML's coarser sampling) as a ratio.
- In Kubernetes (--kubernetes or --pod-resources-socket) every GPU series also carries
  pod, namespace and container of the container the kubelet gave the GPU
  (exporters.pod_resources), empty for a GPU no pod holds; off by default.

DCGM's two counters (PCIe replays, energy) keep dcgm-exporter's names without a
`_total` suffix; client_python would rename a counter family, so they are exported
untyped, which PromQL's rate() accepts just the same.

NVML field-value PCIe counters become `inferd_pcie_*` counters (docs/METRICS.md). The
cumulative TX/RX byte fields (197/198) are 32-bit on the H200 and wrap every 4 GiB
(seen on a real H200: 2**32 is passed many times a second under a 55 GB/s copy), so
the collector unwraps them between scrapes; that is exact only while less than 4 GiB
crosses the link between two scrapes, so for rates use DCGM_FI_PROF_PCIE_*_BYTES.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, UnknownMetricFamily

from inferd.exporters import gpu_reading as gr
from inferd.exporters.gpu_backends import GpuBackend, LazyBackend, open_backend
from inferd.exporters.gpu_nvml import NvmlBackend
from inferd.exporters.pod_resources import POD_LABELS, PodRef, PodResources, pod_labels
from inferd.exporters.pod_resources import add_arguments as add_pod_resources_arguments
from inferd.exporters.pod_resources import shared as shared_pod_resources
from inferd.exporters.registry import BuildContext, Built, CollectorEntry

MIB = 1024 * 1024
DCGM_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
# dcgm-exporter's host label: "Hostname" in its releases (4.x), "hostname" on its main branch
HOST_LABELS = ("Hostname", "hostname")
INFERD_LABELS = ["gpu", "UUID", "pci_bus_id"]

# (family, help, GpuReading attribute, scale to dcgm units)
DEV_GAUGES: list[tuple[str, str, str, float]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz", 1.0),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "mem_clock_mhz", 1.0),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gpu_temp_c", 1.0),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_mw", 1e-3),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gpu_util_pct", 1.0),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "mem_copy_util_pct", 1.0),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe link generation, current.", "pcie_gen_current", 1.0),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "PCIe link generation, maximum.", "pcie_gen_max", 1.0),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe link width (lanes), current.", "pcie_width_current", 1.0),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "PCIe link width (lanes), maximum.", "pcie_width_max", 1.0),
]
FB_GAUGES: list[tuple[str, str, str]] = [
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "fb_free_bytes"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "fb_used_bytes"),
    ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", "fb_reserved_bytes"),
]
DEV_COUNTERS: list[tuple[str, str, str]] = [
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "pcie_replay_counter"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", "energy_mj"),
]
# (family, help, GPM key, scale)
PROF_GAUGES: list[tuple[str, str, str, float]] = [
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", "graphics_util_pct", 0.01),
    ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", "sm_util_pct", 0.01),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM.", "sm_occupancy_pct", 0.01),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "any_tensor_util_pct",
        0.01,
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "dram_bw_util_pct",
        0.01,
    ),
]
PCIE_RATE_HELP = (
    "The rate of data {} over the PCIe bus - including both protocol headers and data payloads - in bytes per second."
)
MEMORY_TEMP = ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).")

PCIE_SCALAR_COUNTERS: list[tuple[str, str, int]] = [
    ("inferd_pcie_replay", "PCIe replays seen by the GPU (NVML field 94).", gr.FIELD_PCIE_REPLAY),
    ("inferd_pcie_replay_rollover", "PCIe replay counter rollovers (NVML field 95).", gr.FIELD_PCIE_REPLAY_ROLLOVER),
    ("inferd_pcie_l0_recovery", "PCIe L0 to recovery transitions (NVML field 169).", gr.FIELD_PCIE_L0_TO_RECOVERY),
]


class GpuCollector:
    """Yields DCGM_FI_* and inferd_pcie_* families from one back-end read per scrape."""

    name = "gpu"

    def __init__(self, backend: GpuBackend, host_label: str = "Hostname", pods: PodResources | None = None):
        if host_label not in HOST_LABELS:
            raise ValueError(f"dcgm host label must be one of {HOST_LABELS}, got {host_label!r}")
        self.backend = backend
        self.host_label = host_label
        self.pods = pods
        self._byte_counters = WrappingCounters(bits=32)

    def collect(self) -> Iterator[Metric]:
        snapshot = self.backend.read()
        owner_of: Callable[[gr.GpuReading], PodRef | None] | None = None
        if self.pods is not None:
            owners = self.pods.owners()  # one kubelet answer for the whole scrape

            def owner(gpu: gr.GpuReading) -> PodRef | None:
                return owners.get(gpu.uuid) or owners.get(f"nvidia{gpu.minor_number}")

            owner_of = owner
        yield from snapshot_families(snapshot, self._byte_counters, host_label=self.host_label, owner_of=owner_of)
        if self.pods is not None:
            up = GaugeMetricFamily(
                "inferd_pod_resources_up",
                "1 if the kubelet's pod-resources API answered the latest List (GPU pod labels), else 0",
            )
            up.add_metric([], 1.0 if self.pods.is_up else 0.0)
            yield up


class WrappingCounters:
    """Turns raw counters that wrap at 2**bits into monotonic totals, per key.

    The first raw value seen is the starting total; each later value adds its
    distance from the previous one modulo 2**bits.
    """

    def __init__(self, bits: int):
        if not 1 <= bits <= 64:
            raise ValueError(f"counter width must be 1..64 bits, got {bits}")
        self.modulus = 2**bits
        self._last: dict[tuple, tuple[int, int]] = {}  # key -> (last raw, total)

    def update(self, key: tuple, raw: float) -> int:
        value = int(raw) % self.modulus
        if key not in self._last:
            self._last[key] = (value, value)
            return value
        last, total = self._last[key]
        total += (value - last) % self.modulus
        self._last[key] = (value, total)
        return total


def dcgm_label_names(host_label: str = "Hostname") -> list[str]:
    return [host_label if name == "Hostname" else name for name in DCGM_LABELS]


def dcgm_labels(snapshot: gr.GpuSnapshot, gpu: gr.GpuReading) -> list[str]:
    return [
        str(gpu.index),
        gpu.uuid,
        gpu.pci_bus_id,
        f"nvidia{gpu.minor_number}",
        gpu.name,
        snapshot.hostname,
        snapshot.driver_version,
    ]


def snapshot_families(
    snapshot: gr.GpuSnapshot,
    byte_counters: WrappingCounters | None = None,
    host_label: str = "Hostname",
    owner_of: Callable[[gr.GpuReading], PodRef | None] | None = None,
) -> Iterable[Metric]:
    """The families of one snapshot; with `owner_of` (Kubernetes) each GPU's series also
    carry POD_LABELS."""
    gpus = snapshot.gpus
    pod_values = {g.index: list(pod_labels(owner_of(g))) for g in gpus} if owner_of else {g.index: [] for g in gpus}
    names = dcgm_label_names(host_label) + (POD_LABELS if owner_of else [])
    labels = {g.index: dcgm_labels(snapshot, g) + pod_values[g.index] for g in gpus}

    def family(name: str, doc: str, values: Iterable[tuple[gr.GpuReading, float | None]], kind=GaugeMetricFamily):
        metric = kind(name, doc, labels=names)
        for gpu, value in values:
            if value is not None:
                metric.add_metric(labels[gpu.index], float(value))
        return metric

    for name, doc, attr, scale in DEV_GAUGES:
        yield family(name, doc, ((g, _scaled(getattr(g, attr), scale)) for g in gpus))
    yield family(*MEMORY_TEMP, ((g, g.fields.get(gr.field_key(gr.FIELD_MEMORY_TEMP))) for g in gpus))
    for name, doc, attr in FB_GAUGES:
        yield family(name, doc, ((g, _mib(getattr(g, attr))) for g in gpus))
    for name, doc, attr in DEV_COUNTERS:
        yield family(name, doc, ((g, getattr(g, attr)) for g in gpus), kind=UnknownMetricFamily)
    for name, doc, key, scale in PROF_GAUGES:
        yield family(name, doc, ((g, _scaled(_gpm_value(g, key), scale)) for g in gpus))
    yield family(
        "DCGM_FI_PROF_PCIE_TX_BYTES", PCIE_RATE_HELP.format("transmitted"), ((g, _pcie_rate(g, "tx")) for g in gpus)
    )
    yield family(
        "DCGM_FI_PROF_PCIE_RX_BYTES", PCIE_RATE_HELP.format("received"), ((g, _pcie_rate(g, "rx")) for g in gpus)
    )
    yield from _pcie_field_families(
        gpus, byte_counters or WrappingCounters(bits=32), pod_values, POD_LABELS if owner_of else []
    )


def _gpm_value(gpu: gr.GpuReading, key: str) -> float | None:
    value = (gpu.gpm or {}).get(key)
    if value is None and key == "graphics_util_pct":
        return gpu.gpu_util_pct  # NVML's kernel-running share: see the module's note
    return value


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def _mib(value: int | None) -> float | None:
    return None if value is None else float(value // MIB)


def _pcie_rate(gpu: gr.GpuReading, direction: str) -> float | None:
    if gpu.gpm is not None:
        mib_s = gpu.gpm.get(f"pcie_{direction}_mib_s")
        return None if mib_s is None else mib_s * MIB
    kb_s = getattr(gpu, f"pcie_{direction}_kb_s")
    return None if kb_s is None else kb_s * 1024


def _pcie_field_families(
    gpus: list[gr.GpuReading],
    byte_counters: WrappingCounters,
    pod_values: dict[int, list[str]],
    pod_names: list[str],
) -> Iterable[Metric]:
    base = [*INFERD_LABELS, *pod_names]

    def ids(gpu: gr.GpuReading) -> list[str]:
        return [str(gpu.index), gpu.uuid, gpu.pci_bus_id, *pod_values[gpu.index]]

    for name, doc, field_id in PCIE_SCALAR_COUNTERS:
        metric = CounterMetricFamily(name, doc, labels=base)
        for gpu in gpus:
            value = gpu.fields.get(gr.field_key(field_id))
            if value is not None:
                metric.add_metric(ids(gpu), value)
        yield metric

    errors = CounterMetricFamily(
        "inferd_pcie_link_errors",
        "PCIe link error counters from NVML field values (173-182), by type.",
        labels=[*base, "type"],
    )
    lanes = CounterMetricFamily(
        "inferd_pcie_lane_errors",
        "PCIe per-lane error counter (NVML field 183), by lane.",
        labels=[*base, "lane"],
    )
    tx = CounterMetricFamily(
        "inferd_pcie_tx_bytes", "PCIe bytes transmitted by the GPU (NVML field 197; may wrap).", labels=base
    )
    rx = CounterMetricFamily(
        "inferd_pcie_rx_bytes", "PCIe bytes received by the GPU (NVML field 198; may wrap).", labels=base
    )
    lane_prefix = f"{gr.FIELD_PCIE_LANE_ERRORS}:"
    for gpu in gpus:
        for field_id, kind in gr.PCIE_ERROR_FIELDS.items():
            value = gpu.fields.get(gr.field_key(field_id))
            if value is not None:
                errors.add_metric([*ids(gpu), kind], value)
        lane_values = sorted(
            (int(key.removeprefix(lane_prefix)), value)
            for key, value in gpu.fields.items()
            if key.startswith(lane_prefix)
        )
        for lane, value in lane_values:
            lanes.add_metric([*ids(gpu), str(lane)], value)
        for metric, field_id in ((tx, gr.FIELD_PCIE_TX_BYTES), (rx, gr.FIELD_PCIE_RX_BYTES)):
            value = gpu.fields.get(gr.field_key(field_id))
            if value is not None:
                metric.add_metric(ids(gpu), byte_counters.update((gpu.uuid, field_id), value))
    yield errors
    yield lanes
    yield tx
    yield rx


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("gpu collector")
    group.add_argument("--gpu-backend", default="nvml", help="nvml (default) or replay:PATH")
    group.add_argument("--gpu-interval", type=float, default=1.0, help="GPM sampling window in seconds (default 1)")
    group.add_argument(
        "--dcgm-host-label",
        choices=HOST_LABELS,
        default="Hostname",
        help="dcgm-exporter's host label: Hostname (its releases, default) or hostname (its main branch)",
    )
    add_pod_resources_arguments(group)


def build(context: BuildContext) -> Built:
    spec = context.args.gpu_backend
    if spec.startswith("replay:"):
        backend = open_backend(spec)  # a bad file fails now, clearly
    elif spec == "nvml":
        interval_s = context.args.gpu_interval
        backend = LazyBackend(lambda: NvmlBackend(gpm_interval_s=interval_s))
    else:
        raise ValueError(f"--gpu-backend {spec!r}: use 'nvml' or 'replay:PATH'")
    pods = shared_pod_resources(context.args, context.extra)
    collector = GpuCollector(backend, host_label=getattr(context.args, "dcgm_host_label", "Hostname"), pods=pods)

    def close() -> None:
        backend.close()
        if pods is not None:
            pods.close()

    return Built(collector, close=close)


ENTRY = CollectorEntry(
    "gpu",
    "NVML or a recorded replay: dcgm-exporter's DCGM_FI_* families and the NVML inferd_pcie_* counters",
    build,
    add_arguments=add_arguments,
)
