"""Is an engine pod placed on its GPUs' NUMA node? Read from the host's /proc and /sys.

The kubelet places a Guaranteed pod (CPU Manager `static`, Memory Manager, Topology
Manager `single-numa-node` or `restricted`); where those are off or cannot comply, a pod
may run on the other socket from its GPU. The agent does not fight the kubelet's binding:
it reports it.

- The pod's processes: those whose /proc/PID/cgroup path names the pod's UID (systemd
  driver `kubepods-...-pod<uid with _>.slice`, cgroupfs driver `.../pod<uid>/...`).
- Its GPUs: the /dev/nvidia<minor> files those processes hold open (/proc/PID/fd), the
  minor mapped to a PCI address by /proc/driver/nvidia/gpus/<address>/information
  ("Device Minor:"), the address to a NUMA node by /sys/bus/pci/devices/<address>/numa_node.
  Only processes that hold a GPU count (the pause container and helpers do not).
- Its CPUs: each such process's Cpus_allowed_list (/proc/PID/status, the cpuset the
  kubelet gave it), against /sys/devices/system/node/node<N>/cpulist: misaligned when any
  allowed CPU is on a node that holds none of its GPUs.
- Its memory: resident pages per node (/proc/PID/numa_maps): misaligned when more than
  `remote_ratio` of them are on nodes that hold none of its GPUs.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from inferd.exporters.cgroup_pods import open_gpu_minors
from inferd.exporters.numa import list_nodes, parse_numa_maps, parse_status_field, read_node_cpus
from inferd.exporters.sysfs import parse_cpulist

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class PodPlacement:
    """Where one pod's GPU-holding processes run and keep their memory."""

    gpu_nodes: tuple[int, ...]
    cpu_nodes: tuple[int, ...]  # nodes of the CPUs the processes may run on
    pages_by_node: dict[int, int]
    num_processes: int

    @property
    def remote_memory_ratio(self) -> float | None:
        total = sum(self.pages_by_node.values())
        if not total:
            return None
        return sum(n for node, n in self.pages_by_node.items() if node not in self.gpu_nodes) / total

    @property
    def is_cpus_misaligned(self) -> bool:
        return any(node not in self.gpu_nodes for node in self.cpu_nodes)

    def is_memory_misaligned(self, remote_ratio: float) -> bool:
        ratio = self.remote_memory_ratio
        return ratio is not None and ratio > remote_ratio


def cgroup_names_pod(cgroup_text: str, uid: str) -> bool:
    """Whether a /proc/PID/cgroup names the pod (either cgroup driver's spelling of the UID)."""
    if not uid:
        return False
    spellings = (f"pod{uid}", f"pod{uid.replace('-', '_')}")
    return any(s in line for line in cgroup_text.splitlines() for s in spellings)


def parse_device_minor(information: str) -> int | None:
    """`Device Minor:` of /proc/driver/nvidia/gpus/<address>/information."""
    value = parse_status_field(information, "Device Minor")
    return int(value) if value and value.isdigit() else None


class PlacementReader:
    def __init__(self, procfs_root: str | os.PathLike = "/proc", sysfs_root: str | os.PathLike = "/sys"):
        self.proc = Path(procfs_root)
        self.sys = Path(sysfs_root)

    def gpu_nodes_by_minor(self) -> dict[int, int]:
        """GPU device minor -> NUMA node (a GPU whose node the firmware does not say is left out)."""
        nodes: dict[int, int] = {}
        for info in sorted((self.proc / "driver/nvidia/gpus").glob("*/information")):
            try:
                minor = parse_device_minor(info.read_text())
                node = int((self.sys / "bus/pci/devices" / info.parent.name.lower() / "numa_node").read_text())
            except (OSError, ValueError):
                continue
            if minor is not None and node >= 0:
                nodes[minor] = node
        return nodes

    def cpu_node_map(self) -> dict[int, int]:
        return {cpu: node for node in list_nodes(self.sys) for cpu in read_node_cpus(self.sys, node)}

    def pod_pids(self, uid: str) -> list[int]:
        pids = []
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                text = (entry / "cgroup").read_text()
            except OSError:
                continue  # gone meanwhile, or not ours to read
            if cgroup_names_pod(text, uid):
                pids.append(int(entry.name))
        return sorted(pids)

    def gpu_minors(self, pid: int) -> set[int]:
        return open_gpu_minors(self.proc, pid)

    def placement(self, uid: str) -> PodPlacement | None:
        """The pod's placement, or None when none of its processes holds a GPU."""
        gpu_of_minor = self.gpu_nodes_by_minor()
        if not gpu_of_minor:
            return None
        cpu_node = self.cpu_node_map()
        gpu_nodes: set[int] = set()
        cpu_nodes: set[int] = set()
        pages: dict[int, int] = {}
        count = 0
        for pid in self.pod_pids(uid):
            nodes = {gpu_of_minor[m] for m in self.gpu_minors(pid) if m in gpu_of_minor}
            if not nodes:
                continue
            try:
                status = (self.proc / str(pid) / "status").read_text()
                numa_maps = (self.proc / str(pid) / "numa_maps").read_text()
            except OSError:
                continue
            count += 1
            gpu_nodes |= nodes
            allowed = parse_cpulist(parse_status_field(status, "Cpus_allowed_list") or "")
            cpu_nodes |= {cpu_node[c] for c in allowed if c in cpu_node}
            for node, n in parse_numa_maps(numa_maps).items():
                pages[node] = pages.get(node, 0) + n
        if not count:
            return None
        return PodPlacement(tuple(sorted(gpu_nodes)), tuple(sorted(cpu_nodes)), pages, count)
