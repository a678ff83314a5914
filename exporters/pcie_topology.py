"""The PCIe path of every NVIDIA GPU, walked up the sysfs device tree.

``/sys/devices/pci0000:00/<root port>/<switch upstream port>/<switch downstream port>/<GPU>``:
hop 0 is the GPU and the last hop the root port. A link has two ends: the GPU shares its
link with the switch downstream port above it, a switch upstream port with the root port
above it, so hops pair up (0,1), (2,3), ... The ceiling of a link is the lower of the two
ends' maxima (a Gen5 GPU in a Gen4 slot is not degraded).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from inferd.exporters.pcie_parsers import (
    bdf_sort_key,
    is_bdf,
    link_capacity_bytes_per_second,
    parse_hex_id,
    parse_link_speed,
    parse_link_width,
)
from inferd.exporters.sysfs import parse_cpulist, read_optional, read_text

NVIDIA_VENDOR_ID = 0x10DE
GPU_CLASS_PREFIXES = (0x0300, 0x0302)  # VGA compatible, 3D controller (class >> 8)


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
        GpuPciPath(
            index, device_at(layout.gpu_dir), tuple(device_at(d) for d in layout.bridge_dirs), layout.host_bridge
        )
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
