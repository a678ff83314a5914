"""Allocate host memory on a chosen NUMA node (set_mempolicy(2) around first touch).

Pages are placed when first touched, so the tensor is allocated and zero-filled while
the calling thread's policy prefers the node, and the policy is restored after.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
_SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}


def parse_cpulist(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def node_of_cpus(cpus: set[int], sysfs_root: str = "/sys") -> int | None:
    """The NUMA node holding most of `cpus`, from sysfs; None when sysfs has no nodes."""
    best, best_count = None, 0
    for node_dir in sorted(Path(sysfs_root, "devices/system/node").glob("node[0-9]*")):
        try:
            node_cpus = set(parse_cpulist((node_dir / "cpulist").read_text()))
        except OSError:
            continue
        count = len(node_cpus & cpus)
        if count > best_count:
            best, best_count = int(node_dir.name[4:]), count
    return best


def device_numa_node(device: torch.device, sysfs_root: str = "/sys") -> int | None:
    """NUMA node local to `device`: its PCI device's numa_node for CUDA (or, where that
    reads -1, the node of its local CPUs), the node of our CPUs otherwise."""
    if device.type == "cuda":
        try:
            props = torch.cuda.get_device_properties(device)
            # torch has the PCI ids at run time but not in its stubs; an older torch raises AttributeError below
            domain, bus, dev = props.pci_domain_id, props.pci_bus_id, props.pci_device_id  # type: ignore[attr-defined]
            bdf = f"{domain:04x}:{bus:02x}:{dev:02x}.0"
            pci = Path(sysfs_root, "bus/pci/devices", bdf)
            node = int((pci / "numa_node").read_text())
            if node >= 0:
                return node
            return node_of_cpus(set(parse_cpulist((pci / "local_cpulist").read_text())), sysfs_root)
        except (AttributeError, OSError, ValueError) as exc:
            log.info("NUMA node of %s unknown (%s); using the node of our CPUs", device, exc)
    return node_of_cpus(os.sched_getaffinity(0), sysfs_root)


def _set_mempolicy(mode: int, node: int | None) -> bool:
    number = _SYS_SET_MEMPOLICY.get(platform.machine())
    if number is None:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if node is None:
        return libc.syscall(number, mode, None, ctypes.c_ulong(0)) == 0
    mask = (ctypes.c_ulong * (node // 64 + 1))()
    mask[node // 64] = 1 << (node % 64)
    return libc.syscall(number, mode, mask, ctypes.c_ulong(len(mask) * 64 + 1)) == 0


def empty_on_node(shape: tuple[int, ...], dtype: torch.dtype, node: int | None, pin: bool) -> torch.Tensor:
    """A zeroed host tensor whose pages sit on `node` (best effort; logs when it cannot)."""
    placed = node is not None and _set_mempolicy(MPOL_PREFERRED, node)
    if node is not None and not placed:
        log.warning("could not set a memory policy for NUMA node %s; host pool placed by the kernel", node)
    try:
        tensor = torch.zeros(shape, dtype=dtype, pin_memory=pin)
    finally:
        if placed:
            _set_mempolicy(MPOL_DEFAULT, None)
    return tensor


def available_host_bytes(procfs_root: str = "/proc") -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None when it cannot be read)."""
    try:
        for line in Path(procfs_root, "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
