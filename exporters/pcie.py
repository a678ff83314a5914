"""PCIe links and AER counters of every NVIDIA GPU and the bridges above it, from sysfs.

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

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporters.registry import CollectorUnavailable, SourceAbsent
from exporters.sysfs import parse_cpulist, parse_key_value_counts, read_optional, read_text

NVIDIA_VENDOR_ID = 0x10DE
GPU_CLASS_PREFIXES = (0x0300, 0x0302)  # VGA compatible, 3D controller (class >> 8)
AER_FILES = {"correctable": "aer_dev_correctable", "nonfatal": "aer_dev_nonfatal", "fatal": "aer_dev_fatal"}

_BDF = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_SPEED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")

# Transfer rate (GT/s) -> PCIe generation.
GENERATION_BY_SPEED = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}


# ---- parsers (plain strings) ----

def parse_link_speed(text: str) -> float | None:
    """GT/s from current_link_speed / max_link_speed: "16.0 GT/s PCIe" (kernel >= 4.19),
    "8 GT/s" (older); None for "Unknown speed" / "Unknown"."""
    match = _SPEED.match(text)
    if match:
        return float(match.group(1))
    if text.strip().lower().startswith("unknown"):
        return None
    raise ValueError(f"bad PCIe link speed {text!r}: expected like '16.0 GT/s PCIe'")


def parse_link_width(text: str) -> int:
    """Lanes from current_link_width / max_link_width ("16"; 0 means the link is down)."""
    try:
        width = int(text.strip())
    except ValueError:
        raise ValueError(f"bad PCIe link width {text!r}: expected an integer like '16'") from None
    if width < 0:
        raise ValueError(f"bad PCIe link width {text!r}: negative")
    return width


def parse_hex_id(text: str, what: str) -> int:
    try:
        return int(text.strip(), 16)
    except ValueError:
        raise ValueError(f"bad PCI {what} {text!r}: expected hex like '0x10de'") from None


def parse_aer_counters(text: str) -> dict[str, int]:
    """Counters by error name from an aer_dev_* file ("RxErr 0", "BadTLP 3", ...,
    "dev_cor_errs_bit[3] 5" for unnamed bits). The TOTAL_* line is dropped: it is the
    sum of the others, which PromQL can compute."""
    counts = parse_key_value_counts(text, source="aer_dev_* file")
    return {name: value for name, value in counts.items() if not name.startswith("TOTAL_")}


def generation_of(speed_gts: float | None) -> int | None:
    return GENERATION_BY_SPEED.get(speed_gts) if speed_gts is not None else None


def lane_bytes_per_second(speed_gts: float) -> float:
    """Payload bytes per second one lane carries in one direction at this rate.

    Gen1/2 (2.5, 5 GT/s) use 8b/10b encoding, Gen3-5 128b/130b. Gen6+ (64 GT/s, PAM4)
    uses 256-byte FLITs of which 242 carry TLP and DLLP bytes (the rest FEC and CRC).
    """
    if speed_gts <= 5.0:
        efficiency = 8 / 10
    elif speed_gts < 64.0:
        efficiency = 128 / 130
    else:
        efficiency = 242 / 256
    return speed_gts * 1e9 * efficiency / 8


def link_capacity_bytes_per_second(speed_gts: float | None, width: int | None) -> float | None:
    if speed_gts is None or width is None:
        return None
    return width * lane_bytes_per_second(speed_gts)


def bdf_sort_key(bdf: str) -> tuple[int, int, int, int]:
    match = _BDF.match(bdf)
    if not match:
        raise ValueError(f"bad PCI address {bdf!r}: expected DDDD:BB:DD.F")
    return tuple(int(group, 16) for group in match.groups())  # type: ignore[return-value]


def nvml_bus_id(bdf: str) -> str:
    """sysfs "0000:c3:00.0" -> NVML's "00000000:C3:00.0" (8-digit domain, upper case)."""
    domain, bus, device, function = bdf_sort_key(bdf)
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}"


def is_bdf(name: str) -> bool:
    return bool(_BDF.match(name))


# ---- sysfs reading ----

@dataclass(frozen=True, slots=True)
class LinkState:
    current_speed_gts: float | None
    max_speed_gts: float | None
    current_width: int | None
    max_width: int | None


@dataclass(frozen=True, slots=True)
class PciDevice:
    bdf: str
    vendor_id: int
    device_id: int
    class_code: int
    numa_node: int | None  # None when sysfs reads -1 (no affinity reported)
    local_cpus: tuple[int, ...]
    link: LinkState

    @property
    def is_nvidia_gpu(self) -> bool:
        return self.vendor_id == NVIDIA_VENDOR_ID and (self.class_code >> 8) in GPU_CLASS_PREFIXES


@dataclass(frozen=True, slots=True)
class GpuPciPath:
    """One GPU and the bridges above it, nearest first, ending at the root port."""

    index: int  # position in PCI bus order, which is NVML's enumeration order
    gpu: PciDevice
    bridges: tuple[PciDevice, ...]
    host_bridge: str  # sysfs name of the root complex, e.g. "pci0000:00"

    @property
    def hops(self) -> tuple[PciDevice, ...]:
        return (self.gpu, *self.bridges)

    @property
    def root_port(self) -> PciDevice | None:
        return self.bridges[-1] if self.bridges else None


def _optional(path: Path, parse):
    text = read_optional(path)
    return None if text is None else parse(text)


def read_link_state(device_dir: Path) -> LinkState:
    return LinkState(
        current_speed_gts=_optional(device_dir / "current_link_speed", parse_link_speed),
        max_speed_gts=_optional(device_dir / "max_link_speed", parse_link_speed),
        current_width=_optional(device_dir / "current_link_width", parse_link_width),
        max_width=_optional(device_dir / "max_link_width", parse_link_width),
    )


def read_pci_device(device_dir: Path) -> PciDevice:
    numa_text = read_optional(device_dir / "numa_node")
    numa_node = int(numa_text) if numa_text not in (None, "") else None
    cpus_text = read_optional(device_dir / "local_cpulist")
    return PciDevice(
        bdf=device_dir.name,
        vendor_id=parse_hex_id(read_text(device_dir / "vendor"), "vendor"),
        device_id=parse_hex_id(read_text(device_dir / "device"), "device"),
        class_code=parse_hex_id(read_text(device_dir / "class"), "class"),
        numa_node=numa_node if numa_node is not None and numa_node >= 0 else None,
        local_cpus=parse_cpulist(cpus_text) if cpus_text else (),
        link=read_link_state(device_dir),
    )


def pci_devices_dir(sysfs_root: str | Path) -> Path:
    return Path(sysfs_root) / "bus" / "pci" / "devices"


@dataclass(frozen=True, slots=True)
class GpuLayout:
    """Where one GPU and its bridges live in sysfs; fixed until devices come or go."""

    gpu_dir: Path
    bridge_dirs: tuple[Path, ...]  # nearest first
    host_bridge: str


def is_gpu_dir(device_dir: Path) -> bool:
    vendor = read_optional(device_dir / "vendor")
    class_code = read_optional(device_dir / "class")
    if vendor is None or class_code is None:
        return False
    return (
        parse_hex_id(vendor, "vendor") == NVIDIA_VENDOR_ID
        and (parse_hex_id(class_code, "class") >> 8) in GPU_CLASS_PREFIXES
    )


def list_pci_devices(sysfs_root: str | Path) -> list[str]:
    """BDFs under <sysfs_root>/bus/pci/devices in bus order; FileNotFoundError if absent."""
    devices_dir = pci_devices_dir(sysfs_root)
    if not devices_dir.is_dir():
        raise FileNotFoundError(f"{devices_dir} does not exist")
    return sorted(os.listdir(devices_dir), key=bdf_sort_key)


def find_gpu_layouts(sysfs_root: str | Path, bdfs: list[str] | None = None) -> list[GpuLayout]:
    """The sysfs directories of every NVIDIA GPU and its bridges, in PCI bus order."""
    devices_dir = pci_devices_dir(sysfs_root)
    layouts = []
    for bdf in bdfs if bdfs is not None else list_pci_devices(sysfs_root):
        # bus/pci/devices/BDF -> ../../../devices/pci0000:00/<root port>/.../BDF
        device_dir = Path(os.path.realpath(devices_dir / bdf))
        if not is_gpu_dir(device_dir):
            continue
        bridges = []
        parent = device_dir.parent
        while is_bdf(parent.name):
            bridges.append(parent)
            parent = parent.parent
        layouts.append(GpuLayout(device_dir, tuple(bridges), parent.name))
    return layouts


def read_gpu_paths(layouts: list[GpuLayout], static: dict[Path, PciDevice] | None = None) -> list[GpuPciPath]:
    """Read each GPU's path. `static` caches what does not change while the device is
    present (ids, NUMA node, CPUs); link state is read fresh on every call, once per
    device even when several GPUs share it."""
    static = static if static is not None else {}
    fresh: dict[Path, PciDevice] = {}

    def device_at(device_dir: Path) -> PciDevice:
        if device_dir not in fresh:
            known = static.get(device_dir)
            if known is None:
                fresh[device_dir] = static[device_dir] = read_pci_device(device_dir)
            else:
                fresh[device_dir] = replace(known, link=read_link_state(device_dir))
        return fresh[device_dir]

    return [
        GpuPciPath(index, device_at(layout.gpu_dir), tuple(device_at(d) for d in layout.bridge_dirs), layout.host_bridge)
        for index, layout in enumerate(layouts)
    ]


def discover_gpu_paths(sysfs_root: str | Path) -> list[GpuPciPath]:
    """Every NVIDIA GPU under ``<sysfs_root>/bus/pci/devices`` with its bridge path,
    in PCI bus order. Raises FileNotFoundError when the PCI bus directory is absent."""
    return read_gpu_paths(find_gpu_layouts(sysfs_root))


def link_ceilings(hops: tuple[PciDevice, ...]) -> list[tuple[float | None, int | None]]:
    """Per hop, the highest speed and width its link can train at: the lower of the two
    ends' maxima. Hops pair up (0,1), (2,3), ...: an endpoint or switch upstream port
    reports the link above it, a downstream or root port the link below it."""
    ceilings = []
    for i, hop in enumerate(hops):
        partner_index = i + 1 if i % 2 == 0 else i - 1
        speed, width = hop.link.max_speed_gts, hop.link.max_width
        if 0 <= partner_index < len(hops):
            partner = hops[partner_index].link
            speed = _lower(speed, partner.max_speed_gts)
            width = _lower(width, partner.max_width)
        ceilings.append((speed, width))
    return ceilings


def _lower(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def is_degraded(link: LinkState, ceiling: tuple[float | None, int | None]) -> bool | None:
    """True when the link trains below its ceiling in speed or width; None when sysfs
    does not report the link (host bridges, some virtual devices)."""
    max_speed, max_width = ceiling
    checks = []
    if link.current_speed_gts is not None and max_speed is not None:
        checks.append(link.current_speed_gts < max_speed)
    if link.current_width is not None and max_width is not None:
        checks.append(link.current_width < max_width)
    return any(checks) if checks else None


def gpu_link_capacity(path: GpuPciPath) -> float | None:
    link = path.gpu.link
    return link_capacity_bytes_per_second(link.current_speed_gts, link.current_width)


# ---- collector ----

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
                    files = [(sev, device_dir / name) for sev, name in AER_FILES.items() if (device_dir / name).exists()]
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
