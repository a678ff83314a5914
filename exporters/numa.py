"""NUMA memory placement from sysfs and procfs.

    inferd_numa_stat_pages_total{node,stat}        /sys/devices/system/node/nodeN/numastat
    inferd_numa_hint_faults_total                  /proc/vmstat numa_hint_faults
    inferd_numa_hint_faults_local_total            /proc/vmstat numa_hint_faults_local
    inferd_numa_pages_migrated_total               /proc/vmstat numa_pages_migrated
    inferd_numa_balancing_enabled                  /proc/sys/kernel/numa_balancing != 0
    inferd_numa_process_resident_pages{pid,comm,node}      engine's pages per node (numa_maps)
    inferd_numa_process_remote_ratio{pid,comm,bound_node}  share of them off its bound node

numa_maps counts each mapping's pages in that mapping's page size (``N0=500
kernelpagesize_kB=2048`` is 500 huge pages); they are converted to base pages
(``base_page_kib``, the kernel's page size) so huge and small pages add up.
The engine's bound node comes from `bound_node_fn` (the supervisor knows it) or, when
that is not given, from the process's ``Mems_allowed_list`` if it names one node.
"""

from __future__ import annotations

import logging
import re
import resource
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from inferd.exporters.registry import BuildContext, Built, CollectorEntry, CollectorUnavailable
from inferd.exporters.sysfs import parse_cpulist, parse_key_value_counts, read_optional, read_text

log = logging.getLogger(__name__)

# numastat file field -> `stat` label
NUMASTAT_FIELDS = {
    "numa_hit": "hit",
    "numa_miss": "miss",
    "numa_foreign": "foreign",
    "interleave_hit": "interleave_hit",
    "local_node": "local",
    "other_node": "other",
}
# /proc/vmstat field -> metric family name (without _total) and help
VMSTAT_COUNTERS = {
    "numa_hint_faults": ("inferd_numa_hint_faults", "NUMA balancing hinting faults (vmstat numa_hint_faults)"),
    "numa_hint_faults_local": (
        "inferd_numa_hint_faults_local",
        "NUMA balancing hinting faults on memory local to the faulting CPU (vmstat numa_hint_faults_local)",
    ),
    "numa_pages_migrated": (
        "inferd_numa_pages_migrated",
        "Pages migrated by NUMA balancing (vmstat numa_pages_migrated)",
    ),
}
_NODE_DIR = re.compile(r"^node(\d+)$")
_NODE_PAGES = re.compile(r"^N(\d+)=(\d+)$")


# ---- parsers (plain strings) ----


def parse_numastat(text: str) -> dict[str, int]:
    """nodeN/numastat -> {stat label: pages}; unknown fields are ignored."""
    counts = parse_key_value_counts(text, source="numastat")
    return {label: counts[field] for field, label in NUMASTAT_FIELDS.items() if field in counts}


def parse_vmstat_numa(text: str) -> dict[str, int]:
    """The NUMA balancing counters present in /proc/vmstat (absent without CONFIG_NUMA_BALANCING)."""
    counts = parse_key_value_counts(text, source="vmstat")
    return {field: counts[field] for field in VMSTAT_COUNTERS if field in counts}


def parse_numa_balancing(text: str) -> bool:
    """/proc/sys/kernel/numa_balancing: 0 off, 1 normal, 2 memory tiering, 3 both."""
    try:
        return int(text.strip()) != 0
    except ValueError:
        raise ValueError(f"bad numa_balancing value {text!r}: expected an integer") from None


def parse_numa_maps(text: str, base_page_kib: int = 4) -> dict[int, int]:
    """Resident base pages per node summed over all mappings of /proc/PID/numa_maps."""
    if base_page_kib <= 0:
        raise ValueError(f"base_page_kib must be positive, got {base_page_kib}")
    pages: dict[int, int] = {}
    for line_number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        per_node: list[tuple[int, int]] = []
        page_kib = base_page_kib
        for field in fields[2:]:
            match = _NODE_PAGES.match(field)
            if match:
                per_node.append((int(match.group(1)), int(match.group(2))))
            elif field.startswith("kernelpagesize_kB="):
                try:
                    page_kib = int(field.partition("=")[2])
                except ValueError:
                    raise ValueError(f"numa_maps line {line_number}: bad {field!r}") from None
        scale = max(page_kib // base_page_kib, 1)
        for node, count in per_node:
            pages[node] = pages.get(node, 0) + count * scale
    return pages


def parse_status_field(text: str, field: str) -> str | None:
    """A field of /proc/PID/status ("Mems_allowed_list:\\t0-1") or None."""
    prefix = field + ":"
    for line in text.splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    return None


def remote_ratio(pages_by_node: dict[int, int], bound_node: int) -> float | None:
    total = sum(pages_by_node.values())
    if total == 0:
        return None
    return (total - pages_by_node.get(bound_node, 0)) / total


# ---- I/O ----


def node_root(sysfs_root: str | Path) -> Path:
    return Path(sysfs_root) / "devices" / "system" / "node"


def list_nodes(sysfs_root: str | Path) -> list[int]:
    """NUMA node ids present under <sysfs>/devices/system/node, sorted."""
    root = node_root(sysfs_root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} does not exist")
    nodes = [int(m.group(1)) for p in root.iterdir() if (m := _NODE_DIR.match(p.name))]
    return sorted(nodes)


def read_node_cpus(sysfs_root: str | Path, node: int) -> tuple[int, ...]:
    return parse_cpulist(read_text(node_root(sysfs_root) / f"node{node}" / "cpulist"))


def default_base_page_kib() -> int:
    return max(resource.getpagesize() // 1024, 1)


# ---- collector ----


class NumaCollector:
    name = "numa"

    def __init__(
        self,
        sysfs_root: str | Path = "/sys",
        procfs_root: str | Path = "/proc",
        engine_pid_fn: Callable[[], int | None] | None = None,
        bound_node_fn: Callable[[], int | None] | None = None,
        base_page_kib: int | None = None,
    ):
        self.sysfs_root = Path(sysfs_root)
        self.procfs_root = Path(procfs_root)
        self.engine_pid_fn = engine_pid_fn
        self.bound_node_fn = bound_node_fn
        self.base_page_kib = base_page_kib if base_page_kib is not None else default_base_page_kib()
        if self.base_page_kib <= 0:
            raise ValueError(f"base_page_kib must be positive, got {self.base_page_kib}")

    def collect(self) -> Iterable[Metric]:
        try:
            nodes = list_nodes(self.sysfs_root)
            numastat = {
                node: parse_numastat(read_text(node_root(self.sysfs_root) / f"node{node}" / "numastat"))
                for node in nodes
            }
            vmstat = parse_vmstat_numa(read_text(self.procfs_root / "vmstat"))
        except FileNotFoundError as exc:
            raise CollectorUnavailable(f"cannot read NUMA statistics: {exc}") from None
        if not nodes:
            raise CollectorUnavailable(f"no NUMA node under {node_root(self.sysfs_root)}")

        stat = CounterMetricFamily(
            "inferd_numa_stat_pages",
            "Pages allocated per NUMA node by outcome (sysfs nodeN/numastat)",
            labels=["node", "stat"],
        )
        for node in nodes:
            for label, value in numastat[node].items():
                stat.add_metric([str(node), label], value)
        yield stat

        for field, (name, help_text) in VMSTAT_COUNTERS.items():
            if field in vmstat:
                yield CounterMetricFamily(name, help_text, value=vmstat[field])

        balancing = read_optional(self.procfs_root / "sys" / "kernel" / "numa_balancing")
        if balancing is not None:
            yield GaugeMetricFamily(
                "inferd_numa_balancing_enabled",
                "1 when automatic NUMA balancing is on (/proc/sys/kernel/numa_balancing non-zero)",
                value=1.0 if parse_numa_balancing(balancing) else 0.0,
            )
        yield from self._engine_process(nodes)

    def _engine_process(self, nodes: list[int]) -> Iterable[Metric]:
        pid = self.engine_pid_fn() if self.engine_pid_fn else None
        if pid is None:
            return
        process_dir = self.procfs_root / str(pid)
        numa_maps = read_optional(process_dir / "numa_maps")
        if numa_maps is None:  # the engine exited between the supervisor's check and now
            log.debug("engine pid %s has no readable numa_maps", pid)
            return
        pages = parse_numa_maps(numa_maps, self.base_page_kib)
        comm = read_optional(process_dir / "comm") or ""
        resident = GaugeMetricFamily(
            "inferd_numa_process_resident_pages",
            "Engine process resident pages per NUMA node from /proc/PID/numa_maps, in base pages",
            labels=["pid", "comm", "node"],
        )
        for node in sorted(set(nodes) | set(pages)):
            resident.add_metric([str(pid), comm, str(node)], pages.get(node, 0))
        yield resident

        bound_node = self._bound_node(process_dir)
        ratio = remote_ratio(pages, bound_node) if bound_node is not None else None
        if ratio is not None:
            remote = GaugeMetricFamily(
                "inferd_numa_process_remote_ratio",
                "Share of the engine process's resident pages that are not on the NUMA node it is bound to",
                labels=["pid", "comm", "bound_node"],
            )
            remote.add_metric([str(pid), comm, str(bound_node)], ratio)
            yield remote

    def _bound_node(self, process_dir: Path) -> int | None:
        if self.bound_node_fn is not None:
            return self.bound_node_fn()
        status = read_optional(process_dir / "status")
        allowed = parse_status_field(status, "Mems_allowed_list") if status else None
        nodes = parse_cpulist(allowed) if allowed else ()
        return nodes[0] if len(nodes) == 1 else None


def build(context: BuildContext) -> Built:
    return Built(
        NumaCollector(
            context.args.sysfs_root,
            context.args.procfs_root,
            engine_pid_fn=context.engine_pid,
            bound_node_fn=lambda: context.bound_node,
        )
    )


ENTRY = CollectorEntry("numa", "sysfs and procfs: numastat, NUMA balancing, the engine's pages per node", build)
