"""PCIe collector: links and AER counters of every NVIDIA GPU and the bridges above it, from sysfs.

The path walk is exporters.pcie_topology, the value parsers exporters.pcie_parsers.

For each GPU (vendor 0x10de, class 0x0300xx VGA or 0x0302xx 3D controller) the path is
walked up the sysfs device tree, ``/sys/devices/pci0000:00/<root port>/<switch upstream
port>/<switch downstream port>/<GPU>``, so hop 0 is the GPU and the last hop the root
port. Per hop:

    inferd_pcie_link_speed_gts{gpu,device,hop,kind}     current_link_speed / max_link_speed
    inferd_pcie_link_width{gpu,device,hop,kind}         current_link_width / max_link_width
    inferd_pcie_link_degraded{gpu,device,hop}           1 when the link trains below its ceiling
    inferd_pcie_link_capacity_bytes_per_second{gpu,pci_bus_id}   the GPU's own link, per direction
    inferd_pcie_aer_errors_total{device,severity,error}   aer_dev_{correctable,nonfatal,fatal}

A link has two ends: the GPU shares its link with the switch downstream port above it,
a switch upstream port with the root port above it, so hops pair up (0,1), (2,3), ...
The ceiling of a link is the lower of the two ends' maxima (a Gen5 GPU in a Gen4 slot
is not degraded); `degraded` compares the current speed and width with that ceiling.
NVIDIA GPUs may lower their link speed when idle to save power, so a speed-only
`degraded` on an idle GPU is expected; a width below the ceiling never is.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from inferd.exporters.pcie_parsers import nvml_bus_id, parse_aer_counters
from inferd.exporters.pcie_topology import (
    GpuLayout,
    GpuPciPath,
    PciDevice,
    find_gpu_layouts,
    gpu_link_capacity,
    is_degraded,
    link_ceilings,
    list_pci_devices,
    pci_devices_dir,
    read_gpu_paths,
)
from inferd.exporters.registry import BuildContext, Built, CollectorEntry, CollectorUnavailable, SourceAbsent
from inferd.exporters.sysfs import read_optional

AER_FILES = {"correctable": "aer_dev_correctable", "nonfatal": "aer_dev_nonfatal", "fatal": "aer_dev_fatal"}


class PcieCollector:
    name = "pcie"

    def __init__(self, sysfs_root: str | Path = "/sys"):
        self.sysfs_root = Path(sysfs_root)
        # The device layout is re-walked only when the set of PCI devices changes.
        self._bdfs: list[str] | None = None
        self._layouts: list[GpuLayout] = []
        self._static: dict[Path, PciDevice] = {}
        self._aer_files: list[tuple[str, list[tuple[str, Path]]]] | None = None

    def _gpu_paths(self) -> list[GpuPciPath]:
        bdfs = list_pci_devices(self.sysfs_root)
        if bdfs != self._bdfs:
            self._layouts = find_gpu_layouts(self.sysfs_root, bdfs)
            self._static = {}
            self._aer_files = None
            self._bdfs = bdfs
        return read_gpu_paths(self._layouts, self._static)

    def collect(self) -> Iterable[Metric]:
        try:
            paths = self._gpu_paths()
        except FileNotFoundError as exc:
            raise CollectorUnavailable(f"cannot read PCI devices: {exc}") from None
        if not paths:
            raise SourceAbsent(f"no NVIDIA GPU under {pci_devices_dir(self.sysfs_root)}")

        hop_labels = ["gpu", "device", "hop", "kind"]
        speed = GaugeMetricFamily(
            "inferd_pcie_link_speed_gts",
            "PCIe link speed per lane in GT/s of each hop from the GPU (hop 0) to its root port, as sysfs reports it",
            labels=hop_labels,
        )
        width = GaugeMetricFamily(
            "inferd_pcie_link_width",
            "PCIe link width in lanes of each hop from the GPU (hop 0) to its root port, as sysfs reports it",
            labels=hop_labels,
        )
        degraded = GaugeMetricFamily(
            "inferd_pcie_link_degraded",
            "1 when the hop's link trains below the lower of its two ends' maximum speed or width",
            labels=["gpu", "device", "hop"],
        )
        capacity = GaugeMetricFamily(
            "inferd_pcie_link_capacity_bytes_per_second",
            "Payload capacity of the GPU's own PCIe link per direction: current width x per-lane rate after encoding",
            labels=["gpu", "pci_bus_id"],
        )
        for path in paths:
            gpu = str(path.index)
            for hop_index, (hop, ceiling) in enumerate(zip(path.hops, link_ceilings(path.hops))):
                labels = [gpu, hop.bdf, str(hop_index)]
                for kind, speed_value, width_value in (
                    ("current", hop.link.current_speed_gts, hop.link.current_width),
                    ("max", hop.link.max_speed_gts, hop.link.max_width),
                ):
                    if speed_value is not None:
                        speed.add_metric(labels + [kind], speed_value)
                    if width_value is not None:
                        width.add_metric(labels + [kind], width_value)
                hop_degraded = is_degraded(hop.link, ceiling)
                if hop_degraded is not None:
                    degraded.add_metric(labels, 1.0 if hop_degraded else 0.0)
            gpu_capacity = gpu_link_capacity(path)
            if gpu_capacity is not None:
                capacity.add_metric([gpu, nvml_bus_id(path.gpu.bdf)], gpu_capacity)
        yield speed
        yield width
        yield degraded
        yield capacity
        yield self._aer_errors(paths)

    def _aer_sources(self, paths: list[GpuPciPath]) -> list[tuple[str, list[tuple[str, Path]]]]:
        """Per device on any GPU path (once each), its aer_dev_* files. Whether a device
        has AER is fixed while it is present, so absent files are looked for only when
        the device layout changes, not on every scrape."""
        if self._aer_files is None:
            self._aer_files = []
            seen: set[str] = set()
            for path in paths:
                for hop in path.hops:
                    if hop.bdf in seen:
                        continue
                    seen.add(hop.bdf)
                    device_dir = pci_devices_dir(self.sysfs_root) / hop.bdf
                    files = [
                        (sev, device_dir / name) for sev, name in AER_FILES.items() if (device_dir / name).exists()
                    ]
                    if files:
                        self._aer_files.append((hop.bdf, files))
        return self._aer_files

    def _aer_errors(self, paths: list[GpuPciPath]) -> Metric:
        aer = CounterMetricFamily(
            "inferd_pcie_aer_errors",
            "PCIe AER errors the kernel counted on the device, by severity and error type (aer_dev_* in sysfs)",
            labels=["device", "severity", "error"],
        )
        for bdf, files in self._aer_sources(paths):
            for severity, file_path in files:
                text = read_optional(file_path)
                if text is None:
                    continue
                for error, count in parse_aer_counters(text).items():
                    aer.add_metric([bdf, severity, error], count)
        return aer


def build(context: BuildContext) -> Built:
    return Built(PcieCollector(context.args.sysfs_root))


ENTRY = CollectorEntry(
    "pcie", "sysfs: link speed and width of every hop from each GPU to its root port, AER counters", build
)
