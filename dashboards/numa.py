"""NUMA board: where host memory is allocated and touched, per node and per process."""

from __future__ import annotations

from .common import GPU, HOST, H
from .spec import Board, Panel, Query, Row, Threshold

PAGES_PER_SECOND = "suffix: pages/s"
PAGES = "suffix: pages"
REMOTE_SHARE = (Threshold(None, "green"), Threshold(0.1, "orange"), Threshold(0.3, "red"))

nodes = Row(
    "Per node",
    (
        Panel(
            "Allocation hits, misses and foreign",
            "Pages per second per node from numastat: hit = allocated on the node the process wanted, "
            "miss = wanted here but allocated elsewhere, foreign = wanted elsewhere but allocated here.",
            PAGES_PER_SECOND,
            (
                Query(
                    f'sum by (node, stat) (rate(inferd_numa_stat_pages_total{{{H}, stat=~"hit|miss|foreign"}}[$__rate_interval]))',
                    "node {{node}} {{stat}}",
                ),
            ),
            headline=True,
        ),
        Panel(
            "Miss share",
            "Misses over hits plus misses per node: the share of allocations that could not be placed on the "
            "preferred node (memory pressure on that node or a too-strict policy); 0 while nothing is allocated.",
            "percentunit",
            (
                Query(
                    f'sum by (node) (rate(inferd_numa_stat_pages_total{{{H}, stat="miss"}}[$__rate_interval]))'
                    # clamp: a node with no allocations in the interval shows 0, not a gap
                    f' / clamp_min(sum by (node) (rate(inferd_numa_stat_pages_total{{{H}, stat=~"hit|miss"}}[$__rate_interval])), 1e-9)',
                    "node {{node}}",
                ),
            ),
            thresholds=(Threshold(None, "green"), Threshold(0.05, "orange"), Threshold(0.2, "red")),
            min=0,
            max=1,
        ),
        Panel(
            "Local and other-node allocations",
            "Pages per second per node allocated by a process running on that node (local) or on another node (other).",
            PAGES_PER_SECOND,
            (
                Query(
                    f'sum by (node, stat) (rate(inferd_numa_stat_pages_total{{{H}, stat=~"local|other|interleave_hit"}}[$__rate_interval]))',
                    "node {{node}} {{stat}}",
                ),
            ),
        ),
    ),
)

engine = Row(
    "Engine process",
    (
        Panel(
            "Engine remote-memory share",
            "Share of the engine's resident pages that sit on a node other than the one it is bound to (from "
            "/proc/PID/numa_maps). Swap pool, pinned buffers and threads belong on the GPU's node.",
            "percentunit",
            (Query(f"inferd_numa_process_remote_ratio{{{H}}}", "{{comm}} ({{pid}}) bound to {{bound_node}}"),),
            thresholds=REMOTE_SHARE,
            min=0,
            max=1,
            requires="numa-binding",
            headline=True,
        ),
        Panel(
            "Engine resident pages per node",
            "The engine's resident pages on each NUMA node (inferd_numa_process_resident_pages).",
            PAGES,
            (Query(f"inferd_numa_process_resident_pages{{{H}}}", "{{comm}} ({{pid}}) node {{node}}"),),
            stacked=True,
        ),
    ),
)

balancing = Row(
    "NUMA balancing",
    (
        Panel(
            "Hinting faults, local vs remote",
            "NUMA-balancing hinting faults per second (/proc/vmstat): local ones touched memory on the task's node, "
            "remote ones crossed the socket link. Zero when balancing is off.",
            "suffix: faults/s",
            (
                Query(f"sum(rate(inferd_numa_hint_faults_local_total{{{H}}}[$__rate_interval]))", "local"),
                Query(
                    f"sum(rate(inferd_numa_hint_faults_total{{{H}}}[$__rate_interval]))"
                    f" - sum(rate(inferd_numa_hint_faults_local_total{{{H}}}[$__rate_interval]))",
                    "remote",
                ),
            ),
            stacked=True,
        ),
        Panel(
            "Page migrations",
            "Pages per second moved between nodes by NUMA balancing (inferd_numa_pages_migrated_total).",
            PAGES_PER_SECOND,
            (Query(f"sum(rate(inferd_numa_pages_migrated_total{{{H}}}[$__rate_interval]))", "migrated"),),
        ),
        Panel(
            "NUMA balancing enabled",
            "1 when the kernel's automatic NUMA balancing is on (kernel.numa_balancing).",
            "short",
            (Query(f"inferd_numa_balancing_enabled{{{H}}}", "{{host}}"),),
            kind="stat",
            thresholds=(Threshold(None, "blue"), Threshold(1, "green")),
            value_names=((0, "off"), (1, "on")),
            width=6,
        ),
    ),
)

ebpf = Row(
    "Per process (eBPF)",
    (
        Panel(
            "Page allocations by locality",
            "Pages per second allocated per process, split into local and remote to the CPU that asked "
            "(inferd_ebpf_page_allocs_total).",
            PAGES_PER_SECOND,
            (
                Query(
                    f"sum by (comm, locality) (rate(inferd_ebpf_page_allocs_total{{{H}}}[$__rate_interval]))",
                    "{{comm}} {{locality}}",
                ),
            ),
            stacked=True,
            requires="ebpf",
        ),
        Panel(
            "Remote allocation share per process",
            "Remote page allocations over all page allocations per process (1 - local share, so a process with "
            "only local allocations shows 0).",
            "percentunit",
            (
                Query(
                    f'1 - sum by (comm) (rate(inferd_ebpf_page_allocs_total{{{H}, locality="local"}}[$__rate_interval]))'
                    f" / (sum by (comm) (rate(inferd_ebpf_page_allocs_total{{{H}}}[$__rate_interval])) > 0)",
                    "{{comm}}",
                ),
            ),
            thresholds=REMOTE_SHARE,
            min=0,
            max=1,
            requires="ebpf",
        ),
        Panel(
            "Hinting faults per process",
            "NUMA hinting faults per second per process and locality, from the eBPF probes.",
            "suffix: faults/s",
            (
                Query(
                    f"sum by (comm, locality) (rate(inferd_ebpf_numa_hint_faults_total{{{H}}}[$__rate_interval]))",
                    "{{comm}} {{locality}}",
                ),
            ),
            requires="numa-balancing",
        ),
        Panel(
            "eBPF probes up",
            "1 when the probe is loaded and attached (inferd_ebpf_probe_up); the agent log says why one is not.",
            "short",
            (Query(f"inferd_ebpf_probe_up{{{H}}}", "{{probe}}"),),
            kind="state-timeline",
            thresholds=(Threshold(None, "red"), Threshold(1, "green")),
            value_names=((0, "down"), (1, "up")),
        ),
    ),
)

BOARD = Board(
    uid="inferd-numa",
    title="inferd / NUMA",
    description="Host memory placement: per node allocation statistics, the engine's remote share, NUMA balancing "
    "and per-process allocations from eBPF.",
    rows=(nodes, engine, balancing, ebpf),
    variables=(HOST, GPU),
)
