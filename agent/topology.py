"""Node topology: GPU -> PCIe path -> root port -> NUMA node -> CPU list, from sysfs.

`discover(sysfs_root)` reads the PCIe path of every NVIDIA GPU (exporters.pcie) and the
NUMA nodes under ``devices/system/node``, and resolves each GPU's NUMA node:

1. the GPU's ``numa_node`` when it is >= 0;
2. otherwise (it reads -1 on many VMs, e.g. the H200 VM in /work/shared/H200_FACTS.md)
   the node whose ``cpulist`` overlaps the GPU's ``local_cpulist`` most; a tie leaves
   the node unknown rather than guessing.

`Topology.to_dict()` is the stable JSON form (`inferd topo --json`, `/v1/topology`):
lists in PCI bus / node order, CPU lists in the kernel's compact form, bandwidths in
whole bytes per second.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from inferd.exporters.numa import list_nodes, node_root
from inferd.exporters.pcie_parsers import generation_of, link_capacity_bytes_per_second, nvml_bus_id
from inferd.exporters.pcie_topology import GpuPciPath, PciDevice, discover_gpu_paths, is_degraded, link_ceilings
from inferd.exporters.sysfs import format_cpulist, parse_cpulist, read_optional, read_text

_MEM_TOTAL = re.compile(r"MemTotal:\s+(\d+)\s*kB")


@dataclass(frozen=True, slots=True)
class PcieHop:
    device: str  # sysfs BDF, e.g. "0000:02:00.0"
    role: str  # gpu, switch_downstream_port, switch_upstream_port, root_port
    vendor_id: int
    device_id: int
    current_speed_gts: float | None
    max_speed_gts: float | None
    current_width: int | None
    max_width: int | None
    is_degraded: bool | None  # None when sysfs does not report this hop's link
    shared_by_gpus: tuple[int, ...]  # GPUs whose path runs through this device

    @property
    def current_generation(self) -> int | None:
        return generation_of(self.current_speed_gts)

    @property
    def max_generation(self) -> int | None:
        return generation_of(self.max_speed_gts)

    @property
    def capacity_bytes_per_second(self) -> float | None:
        return link_capacity_bytes_per_second(self.current_speed_gts, self.current_width)

    @property
    def is_shared_upstream(self) -> bool:
        """Several GPUs send host traffic over this switch's one link to the root port
        (the root port's side of that link is the same link, so it is not flagged)."""
        return self.role == "switch_upstream_port" and len(self.shared_by_gpus) > 1

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "role": self.role,
            "vendor_id": f"0x{self.vendor_id:04x}",
            "device_id": f"0x{self.device_id:04x}",
            "current_speed_gts": self.current_speed_gts,
            "max_speed_gts": self.max_speed_gts,
            "current_generation": self.current_generation,
            "max_generation": self.max_generation,
            "current_width": self.current_width,
            "max_width": self.max_width,
            "is_degraded": self.is_degraded,
            "shared_by_gpus": list(self.shared_by_gpus),
        }


@dataclass(frozen=True, slots=True)
class GpuTopology:
    index: int  # PCI bus order, NVML's order
    device: str  # sysfs BDF
    pci_bus_id: str  # NVML form
    device_id: int
    path: tuple[PcieHop, ...]  # GPU first, root port last
    host_bridge: str  # e.g. "pci0000:00"
    numa_node: int | None
    numa_node_source: str | None  # "numa_node", "local_cpulist" or None when unknown
    local_cpus: tuple[int, ...]

    @property
    def root_port(self) -> str | None:
        return self.path[-1].device if len(self.path) > 1 else None

    @property
    def link_capacity_bytes_per_second(self) -> float | None:
        return self.path[0].capacity_bytes_per_second

    @property
    def bottleneck_bytes_per_second(self) -> float | None:
        """The lowest current capacity of any link between the GPU and the root port."""
        capacities = [hop.capacity_bytes_per_second for hop in self.path]
        known = [c for c in capacities if c is not None]
        return min(known) if known else None

    @property
    def num_hops(self) -> int:
        """Bridges between the GPU and the root complex."""
        return len(self.path) - 1

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "device": self.device,
            "pci_bus_id": self.pci_bus_id,
            "device_id": f"0x{self.device_id:04x}",
            "host_bridge": self.host_bridge,
            "root_port": self.root_port,
            "numa_node": self.numa_node,
            "numa_node_source": self.numa_node_source,
            "local_cpulist": format_cpulist(self.local_cpus),
            "link_capacity_bytes_per_second": _whole(self.link_capacity_bytes_per_second),
            "bottleneck_bytes_per_second": _whole(self.bottleneck_bytes_per_second),
            "path": [hop.to_dict() for hop in self.path],
        }


@dataclass(frozen=True, slots=True)
class NumaNode:
    node: int
    cpus: tuple[int, ...]
    mem_total_bytes: int | None
    distances: dict[int, int]  # SLIT distance to each node (10 = local)

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "cpulist": format_cpulist(self.cpus),
            "mem_total_bytes": self.mem_total_bytes,
            "distances": {str(k): v for k, v in sorted(self.distances.items())},
        }


@dataclass(frozen=True, slots=True)
class Topology:
    gpus: tuple[GpuTopology, ...]
    nodes: tuple[NumaNode, ...]

    def node(self, node_id: int) -> NumaNode | None:
        return next((n for n in self.nodes if n.node == node_id), None)

    def to_dict(self) -> dict:
        return {"gpus": [g.to_dict() for g in self.gpus], "numa_nodes": [n.to_dict() for n in self.nodes]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


def _whole(value: float | None) -> int | None:
    return None if value is None else int(round(value))


# ---- NUMA nodes ----


def parse_mem_total_bytes(meminfo: str) -> int | None:
    match = _MEM_TOTAL.search(meminfo)
    return int(match.group(1)) * 1024 if match else None


def parse_distances(text: str, node_ids: list[int]) -> dict[int, int]:
    """nodeN/distance ("10 21") lists distances to the nodes in id order."""
    values = [int(v) for v in text.split()]
    if len(values) != len(node_ids):
        raise ValueError(f"bad NUMA distance line {text!r}: {len(values)} values for {len(node_ids)} nodes")
    return dict(zip(node_ids, values))


def read_numa_nodes(sysfs_root: str | Path) -> tuple[NumaNode, ...]:
    try:
        node_ids = list_nodes(sysfs_root)
    except FileNotFoundError:
        return ()
    nodes = []
    for node_id in node_ids:
        node_dir = node_root(sysfs_root) / f"node{node_id}"
        meminfo = read_optional(node_dir / "meminfo")
        distance = read_optional(node_dir / "distance")
        nodes.append(
            NumaNode(
                node=node_id,
                cpus=parse_cpulist(read_text(node_dir / "cpulist")),
                mem_total_bytes=parse_mem_total_bytes(meminfo) if meminfo else None,
                distances=parse_distances(distance, node_ids) if distance else {},
            )
        )
    return tuple(nodes)


def node_of_cpus(cpus: tuple[int, ...], nodes: tuple[NumaNode, ...]) -> int | None:
    """The node whose CPUs overlap `cpus` most; None when none overlaps or two tie."""
    wanted = set(cpus)
    overlaps = sorted(((len(wanted & set(n.cpus)), n.node) for n in nodes), reverse=True)
    if not overlaps or overlaps[0][0] == 0:
        return None
    if len(overlaps) > 1 and overlaps[1][0] == overlaps[0][0]:
        return None
    return overlaps[0][1]


# ---- discovery ----


def hop_role(position: int, num_hops: int) -> str:
    if position == 0:
        return "gpu"
    if position == num_hops - 1:
        return "root_port"
    return "switch_downstream_port" if position % 2 == 1 else "switch_upstream_port"


def build_topology(paths: list[GpuPciPath], nodes: tuple[NumaNode, ...]) -> Topology:
    users: dict[str, list[int]] = {}
    for path in paths:
        for hop in path.hops:
            users.setdefault(hop.bdf, []).append(path.index)
    gpus = []
    for path in paths:
        hops = path.hops
        ceilings = link_ceilings(hops)
        gpu_hops = tuple(
            _hop(device, hop_role(i, len(hops)), is_degraded(device.link, ceilings[i]), tuple(users[device.bdf]))
            for i, device in enumerate(hops)
        )
        numa_node, source = _resolve_node(path.gpu, nodes)
        gpus.append(
            GpuTopology(
                index=path.index,
                device=path.gpu.bdf,
                pci_bus_id=nvml_bus_id(path.gpu.bdf),
                device_id=path.gpu.device_id,
                path=gpu_hops,
                host_bridge=path.host_bridge,
                numa_node=numa_node,
                numa_node_source=source,
                local_cpus=path.gpu.local_cpus,
            )
        )
    return Topology(gpus=tuple(gpus), nodes=nodes)


def _hop(device: PciDevice, role: str, degraded: bool | None, users: tuple[int, ...]) -> PcieHop:
    return PcieHop(
        device=device.bdf,
        role=role,
        vendor_id=device.vendor_id,
        device_id=device.device_id,
        current_speed_gts=device.link.current_speed_gts,
        max_speed_gts=device.link.max_speed_gts,
        current_width=device.link.current_width,
        max_width=device.link.max_width,
        is_degraded=degraded,
        shared_by_gpus=users,
    )


def _resolve_node(gpu: PciDevice, nodes: tuple[NumaNode, ...]) -> tuple[int | None, str | None]:
    if gpu.numa_node is not None:
        return gpu.numa_node, "numa_node"
    node = node_of_cpus(gpu.local_cpus, nodes)
    return (node, "local_cpulist") if node is not None else (None, None)


def discover(sysfs_root: str | Path = "/sys") -> Topology:
    """Read the topology under sysfs_root. No GPU gives an empty `gpus`; a missing PCI
    bus directory raises FileNotFoundError."""
    return build_topology(discover_gpu_paths(sysfs_root), read_numa_nodes(sysfs_root))


# ---- GPU-to-GPU connection type, as `nvidia-smi topo -m` names it ----

CONNECTION_LEGEND = {
    "X": "self",
    "PIX": "at most one PCIe switch between the GPUs",
    "PXB": "several PCIe switches, without the host bridge",
    "PHB": "through a PCIe host bridge (the CPU)",
    "NODE": "between PCIe host bridges within one NUMA node",
    "SYS": "across the interconnect between NUMA nodes (UPI/xGMI)",
}


def connection_type(a: GpuTopology, b: GpuTopology) -> str:
    if a.index == b.index:
        return "X"
    a_bridges = [hop.device for hop in a.path[1:]]
    b_bridges = [hop.device for hop in b.path[1:]]
    for depth_a, device in enumerate(a_bridges, start=1):
        if device in b_bridges:
            depth_b = b_bridges.index(device) + 1
            # GPU -> downstream port -> upstream port: the common device is their switch.
            return "PIX" if max(depth_a, depth_b) <= 2 else "PXB"
    if a.host_bridge == b.host_bridge:
        return "PHB"
    return "NODE" if a.numa_node == b.numa_node else "SYS"
