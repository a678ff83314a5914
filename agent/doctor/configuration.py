"""Configuration: max_num_seqs against the KV capacity, max_model_len against the pool,
the swap pool's node and huge pages, the CPU frequency governor.

KV capacity is vllm:cache_config_info's num_gpu_blocks x block_size (engine /metrics),
max_num_seqs and swap_space_bytes the admin config (or the inferd_engine_tunable
gauge), max_model_len /v1/models; the host side is sysfs and the engine's procfs.
"""

from __future__ import annotations

import re
from pathlib import Path

from inferd.exporters.numa import parse_status_field
from inferd.exporters.sysfs import parse_cpulist, read_optional

from .check import Check
from .findings import Evidence, Finding, FindingMaker
from .inputs import Inputs
from .placement import engine_gpus_and_node
from .thresholds import Thresholds

ID, LAYER = "configuration", "host"
TITLES = {
    "kv_capacity": "max_num_seqs and max_model_len fit the KV pool",
    "swap_pool": "swap pool on the GPUs' node, with huge pages",
    "cpu_governor": "CPU frequency governor set to performance",
}
finding = FindingMaker(ID, LAYER, TITLES)
_HUGEPAGES = re.compile(r"HugePages_Total:\s+(\d+)")
_THP = re.compile(r"\[(\w+)\]")


def tunable(inputs: Inputs, name: str) -> tuple[float | None, str]:
    if inputs.engine_config is not None and name in inputs.engine_config.get("config", {}):
        return inputs.engine_config["config"][name], "engine:/admin/config"
    if inputs.engine is not None:
        value = inputs.engine.value("inferd_engine_tunable", param=name)
        if value is not None:
            return value, f"{inputs.engine.source} inferd_engine_tunable{{param={name!r}}}"
    return None, ""


def run(inputs: Inputs, t: Thresholds) -> list[Finding]:
    return [_kv_capacity(inputs, t), _swap_pool(inputs, t), _governor(inputs)]


def _kv_capacity(inputs: Inputs, t: Thresholds) -> Finding:
    engine = inputs.engine
    if engine is None:
        return finding.skip("kv_capacity", inputs.why("engine"))
    info = engine.all("vllm:cache_config_info")
    labels = info[0].labels if info else {}
    if not labels.get("num_gpu_blocks", "").isdigit() or not labels.get("block_size", "").isdigit():
        return finding.skip("kv_capacity", "the engine exports no vllm:cache_config_info with the pool size")
    blocks, block_size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    tokens = blocks * block_size
    max_seqs, seqs_src = tunable(inputs, "max_num_seqs")
    src = f"{engine.source} vllm:cache_config_info"
    evidence = [Evidence("kv_tokens", tokens, src, "tokens")]
    not_judged: list[str] = []
    problems: list[tuple[str, str]] = []
    max_len = inputs.engine_model.get("max_model_len") if inputs.engine_model else None
    if max_len is not None:
        evidence.append(Evidence("max_model_len", max_len, "engine:/v1/models"))
        if max_len > tokens:
            problems.append(("fail", f"max_model_len {max_len} exceeds the pool's {tokens} tokens"))
    else:
        not_judged.append(f"max_model_len: {inputs.why('engine_model')}")
    if max_seqs is not None:
        per_seq = tokens / max_seqs
        evidence += [Evidence("max_num_seqs", max_seqs, seqs_src), Evidence("kv_tokens_per_seq", per_seq, src)]
        if max_len is not None and per_seq < t.kv_tokens_per_seq_min_share * max_len:
            problems.append(
                (
                    "warn",
                    f"max_num_seqs {max_seqs:.0f} leaves {per_seq:.0f} KV tokens a sequence, under "
                    f"{t.kv_tokens_per_seq_min_share:.0%} of max_model_len {max_len}: full batches preempt",
                )
            )
    else:
        not_judged.append("max_num_seqs: neither the admin config nor inferd_engine_tunable")
    if not problems:
        summary = f"{tokens} KV tokens ({blocks} blocks of {block_size})"
        return finding.ok("kv_capacity", summary, evidence, not_judged=not_judged, layer="engine")
    status = "fail" if any(s == "fail" for s, _ in problems) else "warn"
    return finding(
        "kv_capacity",
        status,
        "; ".join(p for _, p in problems),
        impact=0.3 if status == "fail" else 0.1,
        evidence=evidence,
        fix="lower max_num_seqs (PATCH /admin/config) or --max-model-len, or give the pool more memory "
        "(--gpu-memory-utilization, kv_cold_dtype int8)",
        not_judged=not_judged,
        layer="engine",
    )


def _gpu_node(inputs: Inputs) -> int | None:
    if inputs.engine_pid is not None:
        return engine_gpus_and_node(inputs, inputs.engine_pid)[1]
    if inputs.topology is None:
        return None
    nodes = sorted({g.numa_node for g in inputs.topology.gpus if g.numa_node is not None})
    return nodes[0] if len(nodes) == 1 else None


def _swap_pool(inputs: Inputs, t: Thresholds) -> Finding:
    swap, src = tunable(inputs, "swap_space_bytes")
    if swap is None:
        return finding.skip("swap_pool", inputs.why("engine"))
    evidence = [Evidence("swap_space_bytes", swap, src, "B")]
    if swap == 0:
        return finding.ok("swap_pool", "no host swap pool", evidence)
    not_judged = ["whether the pool is pinned: CUDA pins it through the driver, which procfs does not show"]
    node = _gpu_node(inputs)
    if node is None:
        reason = inputs.missing.get("topology") or inputs.missing.get("gpus") or "the GPUs span several nodes"
        return finding.skip("swap_pool", f"the GPUs' node is unknown: {reason}")
    problems = []
    if inputs.engine_pid is not None:
        status = read_optional(inputs.procfs / str(inputs.engine_pid) / "status") or ""
        mems = parse_cpulist(parse_status_field(status, "Mems_allowed_list") or "")
        if mems:
            evidence.append(
                Evidence("engine_mems_allowed", ",".join(map(str, mems)), f"procfs:{inputs.engine_pid}/status")
            )
            if node not in mems:
                problems.append(f"the engine (and its pool) may not allocate on node {node}")
    else:
        not_judged.append(f"the pool's node: {inputs.why('engine_pid')}")
    if swap >= t.swap_hugepages_min_bytes:
        meminfo = read_optional(inputs.sysfs / "devices" / "system" / "node" / f"node{node}" / "meminfo") or ""
        match = _HUGEPAGES.search(meminfo)
        huge = int(match.group(1)) if match else 0
        thp_path = inputs.sysfs / "kernel" / "mm" / "transparent_hugepage" / "enabled"
        thp_match = _THP.search(read_optional(thp_path) or "")
        thp = thp_match.group(1) if thp_match else None
        evidence += [
            Evidence(f"node{node}_hugepages_total", huge, f"sysfs:devices/system/node/node{node}/meminfo"),
            Evidence("transparent_hugepage", thp, f"sysfs:{thp_path}"),
        ]
        if huge == 0 and thp == "never":
            problems.append(
                f"a {swap / 2**30:.1f} GiB pool with no huge pages on node {node} and transparent huge pages off"
            )
    if not problems:
        summary = f"{swap / 2**30:.1f} GiB swap pool can sit on node {node}"
        return finding.ok("swap_pool", summary, evidence, not_judged=not_judged)
    return finding(
        "swap_pool",
        "warn",
        "; ".join(problems),
        impact=0.1,
        evidence=evidence,
        fix=f"bind the engine to node {node} (see placement) and reserve huge pages there "
        f"(echo N > /sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/nr_hugepages) or set "
        "transparent_hugepage to madvise",
        not_judged=not_judged,
    )


def _governor(inputs: Inputs) -> Finding:
    cpu_root = inputs.sysfs / "devices" / "system" / "cpu"
    cpus: list[int] | None = None
    if inputs.engine_pid is not None:
        status = read_optional(inputs.procfs / str(inputs.engine_pid) / "status") or ""
        cpus = list(parse_cpulist(parse_status_field(status, "Cpus_allowed_list") or "")) or None
    paths = (
        [cpu_root / f"cpu{c}" / "cpufreq" / "scaling_governor" for c in cpus]
        if cpus is not None
        else sorted(Path(cpu_root).glob("cpu[0-9]*/cpufreq/scaling_governor"))
    )
    governors = {p: read_optional(p) for p in paths}
    found = {p: g for p, g in governors.items() if g}
    if not found:
        return finding.skip("cpu_governor", f"no cpufreq governor under {cpu_root} (a VM, or no cpufreq driver)")
    by_governor: dict[str, int] = {}
    for g in found.values():
        by_governor[g] = by_governor.get(g, 0) + 1
    evidence = tuple(
        Evidence(f"cpus_{g}", n, f"sysfs:{cpu_root}/cpu*/cpufreq/scaling_governor")
        for g, n in sorted(by_governor.items())
    )
    slow = {g: n for g, n in by_governor.items() if g != "performance"}
    whose = "the engine's" if cpus is not None else "all"
    if not slow:
        return finding.ok("cpu_governor", f"{whose} {len(found)} CPUs run the performance governor", evidence)
    return finding(
        "cpu_governor",
        "warn",
        f"{sum(slow.values())} of {whose} {len(found)} CPUs run {', '.join(sorted(slow))}: the host side of each step "
        "waits on clock ramp-up",
        impact=0.05,
        evidence=evidence,
        fix="`cpupower frequency-set -g performance` (or tuned-adm profile latency-performance)",
    )


CHECK = Check(ID, LAYER, "engine limits against the KV pool, swap pool, CPU governor", run)
