"""eBPF NUMA probes: who allocates and faults on which node, per process.

Constructor (what the agent calls):

    EbpfNumaCollector(
        sysfs_root="/sys",          # node and memory-block sysfs, read for the node maps
        procfs_root="/proc",        # /proc/<pid>/comm, /proc/sys/kernel/numa_balancing
        watch_pids_fn=None,         # () -> pid | iterable of pids | None; asked every
                                    #   collection (the engine's pid, which changes on restart)
        watch_pids=(),              # --watch-pid
        watch_comms=(),             # --watch-comm (at most 15 characters, the kernel's comm)
        probes=None,                # names from ebpf.probes.PROBES to load; None = all five
        export_numa_balancing=False,  # True only where the NUMA collector does not run:
                                    #   it owns inferd_numa_balancing_enabled (docs/METRICS.md)
        tracefs=None,               # tracefs path; None = find it (mounting it when root)
        process_pods=None,          # exporters.cgroup_pods.ProcessPods in Kubernetes: watched
                                    #   processes' series also get pod, namespace, container
    )

The probes load on the first collect() or on start() (compiling takes about a second;
the agent calls start() from a thread, and until it returns collect() raises
CollectorUnavailable("eBPF probes are still loading")). stop()/close() unloads them.
Each probe is optional and reported on its own:

    inferd_ebpf_probe_up{probe}                             1 loaded, 0 not (reason in the log)
    inferd_ebpf_page_allocs_total{pid,comm,node,locality}   base pages; locality local/remote
                                                            (unknown if the pfn or CPU is in no map)
    inferd_ebpf_numa_hint_faults_total{pid,comm,locality}   only while NUMA balancing is on
    inferd_ebpf_page_migrations_total{reason}               pages, reasons from the format file
    inferd_ebpf_task_numa_moves_total{pid,comm,kind}        kind move/swap/stick
    inferd_ebpf_page_faults_total{pid,comm}                 user-mode page faults

Watched processes get ``pid`` and ``comm`` labels; everything else is summed under
``pid="", comm="other"``, and the counts of processes that leave the watch list (exit,
restart, exec into another name) move there too. With ``process_pods`` (``--kubernetes``
or ``--pod-resources-socket``) the per-process families also carry ``pod``, ``namespace``
and ``container`` (dcgm-exporter's names), from the process's cgroup and the kubelet's
pod-resources answer (exporters.cgroup_pods); empty where no pod is known. With no
engine of its own to name (Kubernetes runs the engines), the agent then watches the
processes that hold open a GPU the kubelet gave to a pod.
The collector stays up (``inferd_collector_up{collector="ebpf"} 1``) when probes are down:
their state is ``inferd_ebpf_probe_up``, so one family says what each probe is doing.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from inferd.ebpf.node_map import FrameRange, read_cpu_nodes, read_frame_ranges
from inferd.ebpf.probes import (
    NUMA_HINT_FAULTS,
    PAGE_ALLOCS,
    PAGE_FAULTS,
    PAGE_MIGRATIONS,
    PROBES,
    TASK_NUMA_MOVES,
    LoadedProbe,
    ProbeUnavailable,
    bpf_permission_problem,
    load_probes,
)
from inferd.ebpf.tracefs import find_tracefs, mount_tracefs, read_symbolic_field
from inferd.ebpf.watch import OTHER_TGID, DepartedProcessFolder, WatchList
from inferd.exporters.cgroup_pods import ProcessPods
from inferd.exporters.pod_resources import NO_POD, POD_LABELS, pod_labels
from inferd.exporters.pod_resources import shared as shared_pod_resources
from inferd.exporters.registry import BuildContext, Built, CollectorEntry, CollectorUnavailable

log = logging.getLogger(__name__)

LOCALITY = {0: "local", 1: "remote", 2: "unknown"}
MOVE_KIND = {0: "move", 1: "swap", 2: "stick"}


def add_watch_arguments(parser: argparse.ArgumentParser) -> None:
    """The agent's --watch-pid / --watch-comm options, for EbpfNumaCollector."""
    parser.add_argument(
        "--watch-pid",
        type=int,
        action="append",
        default=[],
        metavar="PID",
        help="give this process its own eBPF NUMA labels (repeatable)",
    )
    parser.add_argument(
        "--watch-comm",
        action="append",
        default=[],
        metavar="COMM",
        help="give processes with this comm their own eBPF NUMA labels (repeatable)",
    )


class EbpfNumaCollector:
    name = "ebpf"

    def __init__(
        self,
        sysfs_root: str | Path = "/sys",
        procfs_root: str | Path = "/proc",
        watch_pids_fn: Callable[[], Iterable[int] | int | None] | None = None,
        watch_pids: Iterable[int] = (),
        watch_comms: Iterable[str] = (),
        probes: Iterable[str] | None = None,
        export_numa_balancing: bool = False,
        tracefs: str | Path | None = None,
        process_pods: ProcessPods | None = None,
    ):
        self.sysfs_root = Path(sysfs_root)
        self.procfs_root = Path(procfs_root)
        self.watch = WatchList(self.procfs_root, watch_pids_fn, tuple(watch_pids), tuple(watch_comms))
        self.probe_names = tuple(PROBES) if probes is None else tuple(probes)
        unknown = [p for p in self.probe_names if p not in PROBES]
        if unknown:
            raise ValueError(f"unknown eBPF probe(s) {unknown}; known: {sorted(PROBES)}")
        self.export_numa_balancing = export_numa_balancing
        self._tracefs = Path(tracefs) if tracefs else None
        self.process_pods = process_pods
        self._pod_labels: dict[int, tuple[str, str, str]] = {}
        self._extra_labels = list(POD_LABELS) if process_pods is not None else []
        self._probes: dict[str, LoadedProbe] = {}
        self._down: dict[str, str] = {}
        self._folders = {name: DepartedProcessFolder() for name in self.probe_names}
        self._watched_now: set[int] = set()
        self._migration_reasons: dict[int, str] = {}
        self._started = False
        self._start_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------

    @property
    def probe_reasons(self) -> dict[str, str | None]:
        """probe -> None when loaded, else why not."""
        return {name: self._down.get(name) for name in self.probe_names}

    def probe(self, name: str) -> LoadedProbe | None:
        return self._probes.get(name)

    def start(self) -> None:
        """Load every probe that can be loaded; log why each other one cannot.

        Safe to call from a background thread: collect() meanwhile reports the collector
        unavailable ("still loading") instead of waiting for the compiler.
        """
        with self._start_lock:
            if self._started:
                return
            try:
                self._load_all()
            except Exception as exc:  # a bcc surprise: report it, do not retry on every scrape
                log.exception("ebpf: loading the probes failed")
                for name in self.probe_names:
                    if name not in self._probes:
                        self._down.setdefault(name, f"loading failed: {type(exc).__name__}: {exc}")
            finally:
                self._started = True
        _release_compiler_memory()

    def _load_all(self) -> None:
        problem = bpf_permission_problem(self.procfs_root)
        tracefs = None
        if problem is None:
            tracefs = self._tracefs or find_tracefs() or mount_tracefs()
        loaded: dict[str, LoadedProbe]
        if problem:
            loaded, down = {}, {name: problem for name in self.probe_names}
        else:
            loaded, down = load_probes(
                [PROBES[name] for name in self.probe_names], tracefs=tracefs, sysfs_root=self.sysfs_root
            )
        for name in self.probe_names:
            if name in loaded:
                self._probes[name] = loaded[name]
                log.info("ebpf probe %s loaded (%s)", name, loaded[name].attach)
            else:
                self._down[name] = down[name]
                log.warning("ebpf probe %s down: %s", name, down[name])
        if PAGE_ALLOCS in self._probes:
            try:
                self.load_node_maps(
                    read_frame_ranges(self.sysfs_root, self.procfs_root), read_cpu_nodes(self.sysfs_root)
                )
            except (OSError, ValueError) as exc:
                self._drop(PAGE_ALLOCS, f"cannot build the node maps: {exc}")
        if PAGE_MIGRATIONS in self._probes:
            assert tracefs is not None  # a probe loads only through a mounted tracefs (load_probes)
            try:
                self._migration_reasons = read_symbolic_field(tracefs, "migrate:mm_migrate_pages", "reason")
            except (OSError, ValueError) as exc:  # still counted, labelled by number
                log.warning("ebpf: migration reason names unreadable, using numbers: %s", exc)
        self.refresh_watched()

    def refresh_watched(self) -> None:
        """Tell the kernel the watched pids and comms now (done on every collection)."""
        if not self._probes:
            return
        watched = self._watched_now = self.watch.resolve()
        bpf_objects = {id(probe.bpf_object): probe.bpf_object for probe in self._probes.values()}
        for bpf_object in bpf_objects.values():  # probes compiled together share their watch list
            bpf_object.set_watched(watched, self.watch.comms)

    def load_node_maps(self, ranges: list[FrameRange], cpu_nodes: dict[int, int]) -> None:
        """Replace the page-allocation probe's frame-range and CPU-node maps."""
        probe = self._probes.get(PAGE_ALLOCS)
        if probe is None:
            raise ProbeUnavailable(f"probe {PAGE_ALLOCS} is not loaded: {self._down.get(PAGE_ALLOCS)}")
        probe.load_node_maps(ranges, cpu_nodes)

    def close(self) -> None:
        """Detach and unload every probe."""
        with self._start_lock:
            for probe in self._probes.values():
                probe.close()
            self._probes.clear()

    stop = close  # the agent's name for shutting collectors down

    def _drop(self, name: str, reason: str) -> None:
        self._probes.pop(name).close()
        self._down[name] = reason
        log.warning("ebpf probe %s down: %s", name, reason)

    # -- collection ------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        if not self._started:
            if not self._start_lock.acquire(blocking=False):
                raise CollectorUnavailable("eBPF probes are still loading")
            self._start_lock.release()
            self.start()
        up = GaugeMetricFamily(
            "inferd_ebpf_probe_up", "1 if the eBPF probe is loaded, else 0 (reason in the agent log)", labels=["probe"]
        )
        for name in self.probe_names:
            up.add_metric([name], 1.0 if name in self._probes else 0.0)
        yield up
        self.refresh_watched()
        self._refresh_pod_labels()
        balancing = self._numa_balancing_enabled()
        if self.export_numa_balancing and balancing is not None:
            yield GaugeMetricFamily(
                "inferd_numa_balancing_enabled",
                "1 when automatic NUMA balancing is on (/proc/sys/kernel/numa_balancing non-zero)",
                value=1.0 if balancing else 0.0,
            )
        if PAGE_ALLOCS in self._probes:
            yield self._page_allocs(self._rows(PAGE_ALLOCS))
        if NUMA_HINT_FAULTS in self._probes and balancing:  # with balancing off, zeros would not be facts
            yield self._hint_faults(self._rows(NUMA_HINT_FAULTS))
        if PAGE_MIGRATIONS in self._probes:
            yield self._migrations(self._rows(PAGE_MIGRATIONS))
        if TASK_NUMA_MOVES in self._probes:
            yield self._moves(self._rows(TASK_NUMA_MOVES))
        if PAGE_FAULTS in self._probes:
            yield self._page_faults(self._rows(PAGE_FAULTS))

    def _rows(self, name: str) -> dict[tuple[int, ...], int]:
        probe = self._probes[name]
        rows = probe.read()
        if not probe.is_per_process:
            return rows
        rows, departed = self._folders[name].fold(rows, self._is_watched)
        if departed:
            probe.forget(departed)
            self.watch.forget(departed)
        return rows

    def _is_watched(self, tgid: int) -> bool:
        """Still labelled: on the watch list now (as the kernel may have added a forked
        child before it exec'd into another name) and not gone."""
        return tgid in self._watched_now and self.watch.is_alive(tgid)

    def _refresh_pod_labels(self) -> None:
        if self.process_pods is None:
            return
        try:
            found = self.process_pods.resolve(sorted(self._watched_now))
        except Exception:  # the kubelet or /proc must not fail the eBPF scrape
            log.exception("pod attribution of watched processes failed")
            found = {}
        self._pod_labels = {pid: pod_labels(ref) for pid, ref in found.items()}

    def _process_labels(self, tgid: int) -> list[str]:
        labels = ["" if tgid == OTHER_TGID else str(tgid), self.watch.comm_of(tgid)]
        if self.process_pods is not None:
            labels += self._pod_labels.get(tgid, NO_POD)
        return labels

    def _numa_balancing_enabled(self) -> bool | None:
        try:
            return int((self.procfs_root / "sys/kernel/numa_balancing").read_text().strip()) != 0
        except (OSError, ValueError):  # no CONFIG_NUMA_BALANCING: not enabled, nothing to say
            return None

    def _page_allocs(self, rows: dict) -> Metric:
        family = CounterMetricFamily(
            "inferd_ebpf_page_allocs",
            "Pages allocated, by page node and locality to the CPU",
            labels=["pid", "comm", *self._extra_labels, "node", "locality"],
        )
        for (tgid, node, locality), pages in sorted(rows.items()):
            node_label = str(node) if node >= 0 else "unknown"
            family.add_metric([*self._process_labels(tgid), node_label, LOCALITY.get(locality, "unknown")], pages)
        return family

    def _hint_faults(self, rows: dict) -> Metric:
        family = CounterMetricFamily(
            "inferd_ebpf_numa_hint_faults",
            "NUMA balancing hinting faults, local or remote",
            labels=["pid", "comm", *self._extra_labels, "locality"],
        )
        for (tgid, remote), faults in sorted(rows.items()):
            family.add_metric([*self._process_labels(tgid), "remote" if remote else "local"], faults)
        return family

    def _migrations(self, rows: dict) -> Metric:
        family = CounterMetricFamily(
            "inferd_ebpf_page_migrations", "Pages migrated, by migrate reason", labels=["reason"]
        )
        counts = {code: 0 for code in self._migration_reasons}
        for (code,), pages in rows.items():
            counts[code] = counts.get(code, 0) + pages
        for code, pages in sorted(counts.items()):
            family.add_metric([self._migration_reasons.get(code, str(code))], pages)
        return family

    def _moves(self, rows: dict) -> Metric:
        family = CounterMetricFamily(
            "inferd_ebpf_task_numa_moves",
            "NUMA balancer task moves, swaps and sticks",
            labels=["pid", "comm", *self._extra_labels, "kind"],
        )
        for (tgid, kind), moves in sorted(rows.items()):
            family.add_metric([*self._process_labels(tgid), MOVE_KIND.get(kind, str(kind))], moves)
        return family

    def _page_faults(self, rows: dict) -> Metric:
        family = CounterMetricFamily(
            "inferd_ebpf_page_faults", "User-mode page faults", labels=["pid", "comm", *self._extra_labels]
        )
        for (tgid,), faults in sorted(rows.items()):
            family.add_metric(self._process_labels(tgid), faults)
        return family


def _release_compiler_memory() -> None:
    """Give back the heap clang/LLVM freed while compiling (about 35 MiB for five programs)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _process_pods(context: BuildContext) -> ProcessPods | None:
    resources = shared_pod_resources(context.args, context.extra)
    return None if resources is None else ProcessPods(context.args.procfs_root, resources)


def build(context: BuildContext) -> Built:
    args = context.args
    process_pods = _process_pods(context)
    watch_pids_fn: Callable[[], Iterable[int] | int | None] = context.engine_pid
    if context.supervisor is None and process_pods is not None:
        watch_pids_fn = process_pods.gpu_pids  # Kubernetes runs the engines: watch what holds their GPUs
    collector = EbpfNumaCollector(
        args.sysfs_root,
        args.procfs_root,
        watch_pids_fn=watch_pids_fn,
        watch_pids=args.watch_pid,
        watch_comms=args.watch_comm,
        export_numa_balancing="numa" not in context.enabled,
        process_pods=process_pods,
    )

    def start() -> None:
        # loading probes compiles BPF programs; do not hold up the HTTP server for it
        threading.Thread(target=collector.start, name="ebpf-start", daemon=True).start()

    return Built(collector, start=start, close=collector.stop)


ENTRY = CollectorEntry(
    "ebpf",
    "bcc probes: page allocations, hinting faults, migrations and page faults per process",
    build,
    add_arguments=add_watch_arguments,
)
