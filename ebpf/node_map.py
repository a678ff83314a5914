"""Which NUMA node owns a page frame, and which node a CPU sits on, read from sysfs.

The page-allocation probe learns a page's node from its frame number (pfn) through a
table of frame ranges, and the allocating CPU's node through a CPU-to-node array; both
are loaded into BPF maps from what is read here.

Frame ranges come from the memory blocks linked under each node
(``node/nodeN/memoryM`` covers pfns ``[M * pages_per_block, (M + 1) * pages_per_block)``,
with the block size from ``memory/block_size_bytes``), merged where they touch. Where a
kernel has no memory-block sysfs (CONFIG_MEMORY_HOTPLUG off), the zone spans in
``/proc/zoneinfo`` are used instead.

Readers take the sysfs / procfs root so tests run them on fixture trees; parsers take
plain strings.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from inferd.exporters.sysfs import parse_cpulist

_NODE_DIR = re.compile(r"node(\d+)$")
_MEMORY_BLOCK = re.compile(r"memory(\d+)$")


@dataclass(frozen=True, slots=True)
class FrameRange:
    """Page frames ``[start_pfn, end_pfn)`` that belong to NUMA node ``node``."""

    start_pfn: int
    end_pfn: int
    node: int

    def __post_init__(self) -> None:
        if self.start_pfn < 0 or self.end_pfn <= self.start_pfn:
            raise ValueError(f"frame range [{self.start_pfn}, {self.end_pfn}) is empty or negative")
        if self.node < 0:
            raise ValueError(f"frame range node must be >= 0, got {self.node}")

    @property
    def num_pages(self) -> int:
        return self.end_pfn - self.start_pfn


def merge_ranges(ranges: list[FrameRange]) -> list[FrameRange]:
    """Sort ranges and merge neighbours of the same node; overlaps across nodes are an error."""
    merged: list[FrameRange] = []
    for r in sorted(ranges, key=lambda r: r.start_pfn):
        if merged and r.start_pfn < merged[-1].end_pfn and r.node != merged[-1].node:
            raise ValueError(
                f"frame ranges of node {merged[-1].node} and node {r.node} overlap at pfn {r.start_pfn:#x}"
            )
        if merged and merged[-1].node == r.node and r.start_pfn <= merged[-1].end_pfn:
            last = merged[-1]
            merged[-1] = FrameRange(last.start_pfn, max(last.end_pfn, r.end_pfn), last.node)
        else:
            merged.append(r)
    return merged


def parse_zoneinfo(text: str) -> list[FrameRange]:
    """Zone spans (``start_pfn`` + ``spanned``) per node from /proc/zoneinfo, merged."""
    ranges: list[FrameRange] = []
    node = spanned = None
    for line in text.splitlines():
        header = re.match(r"Node (\d+), zone\s+(\S+)", line)
        if header:
            node, spanned = int(header.group(1)), None
            continue
        fields = line.split()
        if len(fields) == 2 and fields[0] == "spanned":
            spanned = int(fields[1])
        elif len(fields) == 2 and fields[0] == "start_pfn:" and node is not None and spanned:
            start = int(fields[1])
            ranges.append(FrameRange(start, start + spanned, node))
    return merge_ranges(ranges)


def read_cpu_nodes(sysfs_root: str | Path = "/sys") -> dict[int, int]:
    """cpu -> node, from ``devices/system/node/nodeN/cpulist``."""
    node_root = Path(sysfs_root, "devices/system/node")
    if not node_root.is_dir():
        raise FileNotFoundError(f"{node_root} is missing: kernel without NUMA sysfs")
    cpu_nodes: dict[int, int] = {}
    for entry in sorted(node_root.iterdir()):
        m = _NODE_DIR.match(entry.name)
        if not m:
            continue
        cpulist = entry / "cpulist"
        if cpulist.exists():
            for cpu in parse_cpulist(cpulist.read_text()):
                cpu_nodes[cpu] = int(m.group(1))
    if not cpu_nodes:
        raise ValueError(f"no node under {node_root} lists any CPU")
    return cpu_nodes


def read_frame_ranges(
    sysfs_root: str | Path = "/sys", procfs_root: str | Path = "/proc", page_size: int | None = None
) -> list[FrameRange]:
    """Frame ranges per node from memory blocks, or from /proc/zoneinfo without them."""
    page_size = page_size or os.sysconf("SC_PAGE_SIZE")
    block_size_file = Path(sysfs_root, "devices/system/memory/block_size_bytes")
    node_root = Path(sysfs_root, "devices/system/node")
    if block_size_file.exists() and node_root.is_dir():
        pages_per_block = int(block_size_file.read_text().strip(), 16) // page_size
        ranges = []
        for node_dir in node_root.iterdir():
            node = _NODE_DIR.match(node_dir.name)
            if not node:
                continue
            for entry in node_dir.iterdir():
                block = _MEMORY_BLOCK.match(entry.name)
                if block:
                    start = int(block.group(1)) * pages_per_block
                    ranges.append(FrameRange(start, start + pages_per_block, int(node.group(1))))
        if ranges:
            return merge_ranges(ranges)
    zoneinfo = Path(procfs_root, "zoneinfo")
    if not zoneinfo.exists():
        raise FileNotFoundError(f"neither memory blocks under {node_root} nor {zoneinfo} exist")
    ranges = parse_zoneinfo(zoneinfo.read_text())
    if not ranges:
        raise ValueError(f"{zoneinfo} lists no populated zone")
    return ranges
