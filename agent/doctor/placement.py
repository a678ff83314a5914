"""Placement: are the engine's CPUs and memory on its GPUs' NUMA node?

Reads /proc/PID/{status,environ,numa_maps} of the engine (and of each worker process it
started: /proc/PID/task/PID/children), the GPUs it uses (CUDA_VISIBLE_DEVICES as
indices, else all) and their nodes from the topology; `agent.placement` picks the node
when the GPUs span several. The resident pages come from numa_maps; where procfs
cannot show them, the agent's inferd_numa_process_remote_ratio stands in, and the eBPF
collector's inferd_ebpf_page_allocs_total (where loaded) adds where new pages went.
"""

from __future__ import annotations

from pathlib import Path

from inferd.agent.placement import best_node_for_gpus
from inferd.agent.topology import Topology
from inferd.exporters.numa import parse_numa_maps, parse_status_field
from inferd.exporters.sysfs import format_cpulist, parse_cpulist, read_optional

from .check import Check
from .findings import Evidence, Finding, FindingMaker
from .inputs import Inputs
from .thresholds import Thresholds

ID, LAYER = "placement", "numa"
TITLE = "engine CPUs and memory on the GPUs' NUMA node"
finding = FindingMaker(ID, LAYER, TITLE)  # one finding per process: the engine, worker0, ...


def parse_environ(raw: str) -> dict[str, str]:
    """/proc/PID/environ: NUL-separated NAME=value pairs."""
    env = {}
    for item in raw.split("\0"):
        name, sep, value = item.partition("=")
        if sep and name:
            env[name] = value
    return env


def visible_gpus(env: dict[str, str], topology: Topology) -> list[int] | None:
    """GPU indices from CUDA_VISIBLE_DEVICES (indices or UUID-less: only indices are
    mapped); None when unset, so every GPU counts."""
    text = env.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    indices = []
    known = {g.index for g in topology.gpus}
    for part in text.split(","):
        part = part.strip()
        if part.isdigit() and int(part) in known:
            indices.append(int(part))
    return indices


def workers(procfs: Path, pid: int) -> list[int]:
    text = read_optional(procfs / str(pid) / "task" / str(pid) / "children") or ""
    return [int(p) for p in text.split() if p.isdigit()]


def engine_gpus_and_node(inputs: Inputs, pid: int) -> tuple[list[int] | None, int | None]:
    """The GPUs a process uses (None: all) and the NUMA node it belongs on."""
    topology = inputs.topology
    if topology is None:
        return None, None
    env = parse_environ(read_optional(inputs.procfs / str(pid) / "environ") or "")
    gpus = visible_gpus(env, topology)
    nodes = sorted(
        {g.numa_node for g in topology.gpus if g.numa_node is not None and (gpus is None or g.index in gpus)}
    )
    if not nodes:
        return gpus, None
    return gpus, nodes[0] if len(nodes) == 1 else best_node_for_gpus(topology, gpus)


def run(inputs: Inputs, t: Thresholds) -> list[Finding]:
    if inputs.topology is None or not inputs.topology.gpus:
        return [finding.skip("engine", inputs.missing.get("topology") or inputs.why("gpus"))]
    if inputs.engine_pid is None:
        return [finding.skip("engine", inputs.why("engine_pid"))]
    findings = [_process(inputs, t, inputs.engine_pid, "engine")]
    for rank, pid in enumerate(workers(inputs.procfs, inputs.engine_pid)):
        findings.append(_process(inputs, t, pid, f"worker{rank}"))
    return findings


def _process(inputs: Inputs, t: Thresholds, pid: int, what: str) -> Finding:
    topology = inputs.topology
    assert topology is not None
    proc = inputs.procfs / str(pid)
    status = read_optional(proc / "status")
    if status is None:
        return finding.skip(what, f"cannot read {proc}/status (no such process, or not permitted)")
    gpus, node = engine_gpus_and_node(inputs, pid)
    if node is None:
        return finding.skip(what, "the GPUs' NUMA node is unknown (numa_node -1 and no CPU overlap)")
    target = topology.node(node)
    if target is None:
        return finding.skip(what, f"NUMA node {node} is not under {inputs.sysfs}/devices/system/node")
    src = f"procfs:{proc}/status"
    cpus = parse_cpulist(parse_status_field(status, "Cpus_allowed_list") or "")
    mems = parse_cpulist(parse_status_field(status, "Mems_allowed_list") or "")
    gpu_text = "all GPUs" if gpus is None else f"GPUs {','.join(map(str, gpus))}"
    evidence = [
        Evidence("gpus", gpu_text, f"procfs:{proc}/environ CUDA_VISIBLE_DEVICES"),
        Evidence("gpu_numa_node", node, "sysfs:bus/pci/devices/*/numa_node"),
        Evidence("cpus_allowed", format_cpulist(cpus), src),
        Evidence("mems_allowed", format_cpulist(mems), src),
    ]
    problems: list[tuple[str, str]] = []  # (status, text)
    off_node = [c for c in cpus if c not in set(target.cpus)]
    cpu_remote = len(off_node) / len(cpus) if cpus else 0.0
    evidence.append(Evidence("cpus_off_gpu_node_ratio", cpu_remote, src))
    if cpus and cpu_remote >= t.placement_cpu_remote_fail:
        problems.append(("fail", f"{cpu_remote:.0%} of its CPUs are off node {node}"))
    elif off_node:
        problems.append(("warn", f"CPUs {format_cpulist(off_node)} are off node {node}"))
    if mems and node not in mems:
        problems.append(("fail", f"its memory policy allows nodes {format_cpulist(mems)}, not node {node}"))
    elif len(mems) > 1:
        problems.append(("warn", f"its memory is not bound (nodes {format_cpulist(mems)} allowed)"))
    remote, not_judged = _remote_share(inputs, proc, node, pid, evidence)
    if remote is not None and remote >= t.placement_memory_remote_fail:
        problems.append(("fail", f"{remote:.0%} of its pages are off node {node}"))
    elif remote is not None and remote >= t.placement_memory_remote_warn:
        problems.append(("warn", f"{remote:.0%} of its pages are off node {node}"))
    if not problems:
        summary = f"{what} (pid {pid}) runs and allocates on node {node}, the node of {gpu_text}"
        return finding.ok(what, summary, evidence, not_judged=not_judged)
    status_word = "fail" if any(s == "fail" for s, _ in problems) else "warn"
    fix = (
        f"bind the {what} to node {node}: `inferd agent` does it (numactl --cpunodebind={node} "
        f"--membind={node}); a hand-started engine: `numactl --cpunodebind={node} --membind={node} inferd serve ...`"
    )
    # ranking weight, not a measurement: host-side work and host<->GPU copies cross the socket
    # link in proportion to the share off node, and they are part of each step, not all of it
    impact = max(0.3 * max(cpu_remote, remote or 0.0), 0.05) if status_word == "fail" else 0.05
    return finding(
        what,
        status_word,
        f"{what} (pid {pid}) for {gpu_text} on node {node}: " + "; ".join(text for _, text in problems),
        impact=min(impact, 1.0),
        evidence=evidence,
        fix=fix,
        not_judged=not_judged,
    )


def _remote_share(
    inputs: Inputs, proc: Path, node: int, pid: int, evidence: list[Evidence]
) -> tuple[float | None, tuple[str, ...]]:
    ebpf = _ebpf_share(inputs, node, pid)
    if ebpf is not None:
        evidence.append(ebpf)
    numa_maps = read_optional(proc / "numa_maps")
    if numa_maps is not None:
        pages = parse_numa_maps(numa_maps)
        total = sum(pages.values())
        if total:
            share = (total - pages.get(node, 0)) / total
            evidence.append(Evidence("resident_pages_off_gpu_node_ratio", share, f"procfs:{proc}/numa_maps"))
            return share, ()
    if inputs.agent is not None:
        for sample in inputs.agent.all("inferd_numa_process_remote_ratio", pid=str(pid)):
            if sample.labels.get("bound_node") == str(node):
                evidence.append(
                    Evidence("resident_pages_off_gpu_node_ratio", sample.value, f"{inputs.agent.source} {sample.name}")
                )
                return sample.value, ()
    if ebpf is not None:
        return float(ebpf.value), ()  # type: ignore[arg-type]
    return None, (f"remote share of its memory: {proc}/numa_maps unreadable and no agent figure",)


def _ebpf_share(inputs: Inputs, node: int, pid: int) -> Evidence | None:
    """Share of the pages the eBPF probe saw the process allocate off `node` (since the agent started)."""
    if inputs.agent is None:
        return None
    allocs = inputs.agent.all("inferd_ebpf_page_allocs_total", pid=str(pid))
    total = sum(s.value for s in allocs)
    if not total:
        return None
    off = sum(s.value for s in allocs if s.labels.get("node") != str(node))
    return Evidence(
        "allocated_pages_off_gpu_node_ratio", off / total, f"{inputs.agent.source} inferd_ebpf_page_allocs_total"
    )


CHECK = Check(ID, LAYER, TITLE, run)
