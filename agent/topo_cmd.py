"""`inferd topo`: print the GPU / PCIe / NUMA topology and the placement choice.

Without --json: a tree (NUMA node -> host bridge -> root port -> switch ports -> GPU,
with link generation and width on each hop), a GPU x GPU matrix in the terms of
`nvidia-smi topo -m` (PIX/PXB/PHB/NODE/SYS) with CPU and NUMA affinity, a GPU x NUMA
matrix of placement scores, and warnings for degraded hops and shared upstream links.
With --json: the same in a stable JSON form (sorted keys, fixed order of lists).
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sysfs-root", default="/sys", help="sysfs mount to read (default /sys)")
    parser.add_argument(
        "--procfs-root",
        default="/proc",
        help="procfs mount to read (default /proc; unused by topo today, kept for symmetry with `inferd agent`)",
    )
    parser.add_argument("--json", action="store_true", help="print a stable JSON form instead of text")


def run(args: argparse.Namespace) -> int:
    from inferd.agent.topology import discover

    try:
        topology = discover(args.sysfs_root)
    except FileNotFoundError as exc:
        print(f"inferd topo: cannot read PCI devices under --sysfs-root {args.sysfs_root}: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"inferd topo: malformed sysfs data under {args.sysfs_root}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(json.dumps(report_dict(topology), indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(render_text(topology, args.sysfs_root))
    return 0


# ---- the report, shared by the JSON and text forms ----


def degraded_hops(topology) -> list[dict]:
    found = []
    for gpu in topology.gpus:
        for hop_index, hop in enumerate(gpu.path):
            if hop.is_degraded:
                found.append(
                    {
                        "gpu": gpu.index,
                        "hop": hop_index,
                        "device": hop.device,
                        "role": hop.role,
                        "current": _link_text(hop.current_generation, hop.current_width, hop.current_speed_gts),
                        "max": _link_text(hop.max_generation, hop.max_width, hop.max_speed_gts),
                    }
                )
    return found


def shared_upstream_links(topology) -> list[dict]:
    seen: dict[str, dict] = {}
    for gpu in topology.gpus:
        for hop in gpu.path:
            if hop.is_shared_upstream and hop.device not in seen:
                seen[hop.device] = {"device": hop.device, "role": hop.role, "gpus": list(hop.shared_by_gpus)}
    return sorted(seen.values(), key=lambda d: d["device"])


def report_dict(topology) -> dict:
    from inferd.agent.placement import best_node_for_gpus, best_node_per_gpu, score_all
    from inferd.agent.topology import connection_type

    return {
        "topology": topology.to_dict(),
        "gpu_connections": [[connection_type(a, b) for b in topology.gpus] for a in topology.gpus],
        "placement": {
            "scores": [s.to_dict() for s in score_all(topology)],
            "best_node_per_gpu": {str(k): v for k, v in best_node_per_gpu(topology).items()},
            "best_node_all_gpus": best_node_for_gpus(topology),
        },
        "degraded_hops": degraded_hops(topology),
        "shared_upstream_links": shared_upstream_links(topology),
    }


def _link_text(generation: int | None, width: int | None, speed: float | None) -> str:
    gen = f"Gen{generation}" if generation else (f"{speed:g} GT/s" if speed else "?")
    return f"{gen} x{width}" if width is not None else gen


# ---- text form ----

ROLE_NAMES = {
    "gpu": "GPU",
    "switch_downstream_port": "switch downstream port",
    "switch_upstream_port": "switch upstream port",
    "root_port": "root port",
}


def render_text(topology, sysfs_root: str) -> str:
    lines: list[str] = []
    lines += _tree_lines(topology, sysfs_root)
    if topology.gpus:
        lines += [""] + _gpu_matrix_lines(topology)
        lines += [""] + _numa_matrix_lines(topology)
        lines += [""] + _warning_lines(topology)
    return "\n".join(lines) + "\n"


def _hop_text(hop) -> str:
    if hop.current_width is None and hop.current_speed_gts is None:
        return "link not reported"
    text = _link_text(hop.current_generation, hop.current_width, hop.current_speed_gts)
    if hop.is_degraded:
        text += f" (max {_link_text(hop.max_generation, hop.max_width, hop.max_speed_gts)}) DEGRADED"
    return text


def _tree_lines(topology, sysfs_root: str) -> list[str]:
    from inferd.exporters.sysfs import format_cpulist

    lines = [f"Topology under {sysfs_root}"]
    # node -> host bridge -> nested {device: (hop, children)} built from root port down
    by_node: dict = {}
    for gpu in topology.gpus:
        level = by_node.setdefault(gpu.numa_node, {}).setdefault(gpu.host_bridge, {})
        for hop in reversed(gpu.path):
            label = hop.device
            entry = level.setdefault(label, [hop, gpu.index if hop.role == "gpu" else None, {}])
            level = entry[2]
    node_ids = [n.node for n in topology.nodes] + sorted(
        (k for k in by_node if k not in {n.node for n in topology.nodes}), key=lambda k: (k is None, k or 0)
    )
    for node_id in node_ids:
        node = topology.node(node_id) if node_id is not None else None
        if node is not None:
            memory = f", memory {node.mem_total_bytes / 2**30:.1f} GiB" if node.mem_total_bytes else ""
            lines.append(f"NUMA node {node_id}: CPUs {format_cpulist(node.cpus)}{memory}")
        else:
            lines.append("NUMA node unknown")
        for host_bridge, devices in sorted(by_node.get(node_id, {}).items()):
            lines.append(f"  {host_bridge} (host bridge)")
            _walk(devices, 2, lines)
    if not topology.gpus:
        lines.append("no NVIDIA GPU found")
    return lines


def _walk(devices: dict, depth: int, lines: list[str]) -> None:
    for device, (hop, gpu_index, children) in sorted(devices.items()):
        name = f"GPU{gpu_index} {device}" if gpu_index is not None else f"{device} {ROLE_NAMES.get(hop.role, hop.role)}"
        shared = f"  shared by GPUs {','.join(map(str, hop.shared_by_gpus))}" if hop.is_shared_upstream else ""
        lines.append(f"{'  ' * depth}{name}  {_hop_text(hop)}{shared}")
        _walk(children, depth + 1, lines)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    fmt = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [fmt(header)] + [fmt(r) for r in rows]


def _gpu_matrix_lines(topology) -> list[str]:
    from inferd.agent.topology import CONNECTION_LEGEND, connection_type
    from inferd.exporters.sysfs import format_cpulist

    header = [""] + [f"GPU{g.index}" for g in topology.gpus] + ["CPU Affinity", "NUMA Affinity", "Link"]
    rows = []
    for a in topology.gpus:
        own = a.path[0]
        rows.append(
            [f"GPU{a.index}"]
            + [connection_type(a, b) for b in topology.gpus]
            + [
                format_cpulist(a.local_cpus) or "N/A",
                "N/A" if a.numa_node is None else str(a.numa_node),
                _hop_text(own),
            ]
        )
    legend = ["", "Legend:"] + [f"  {k:<4} = {v}" for k, v in CONNECTION_LEGEND.items()]
    return _table(header, rows) + legend


def _numa_matrix_lines(topology) -> list[str]:
    from inferd.agent.placement import best_node_for_gpus, best_node_per_gpu, score

    best = best_node_per_gpu(topology)
    header = ["placement score"] + [f"node{n.node}" for n in topology.nodes] + ["best", "bottleneck"]
    rows = []
    for gpu in topology.gpus:
        cells = []
        for node in topology.nodes:
            mark = "*" if best[gpu.index] == node.node else ""
            cells.append(f"{score(topology, gpu, node.node).score:.1f}{mark}")
        bottleneck = gpu.bottleneck_bytes_per_second
        rows.append(
            [f"GPU{gpu.index}"] + cells + [str(best[gpu.index]), f"{bottleneck / 1e9:.1f} GB/s" if bottleneck else "?"]
        )
    footer = [
        "",
        "score = bottleneck GB/s / (1 + 0.1 x hops) / cross-node distance ratio (see agent/placement.py)",
        f"engine placement for all GPUs: NUMA node {best_node_for_gpus(topology)}",
    ]
    return _table(header, rows) + footer


def _warning_lines(topology) -> list[str]:
    lines = []
    for d in degraded_hops(topology):
        lines.append(
            f"DEGRADED  GPU{d['gpu']} hop {d['hop']} {d['device']} ({ROLE_NAMES.get(d['role'], d['role'])}): "
            f"{d['current']}, max {d['max']}"
        )
    for s in shared_upstream_links(topology):
        gpus = ", ".join(f"GPU{i}" for i in s["gpus"])
        lines.append(f"SHARED    {s['device']} ({ROLE_NAMES.get(s['role'], s['role'])}) carries {gpus} upstream")
    return lines or ["no degraded or shared links"]
