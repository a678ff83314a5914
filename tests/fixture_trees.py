"""Write fixture sysfs/procfs trees from the declarative descriptions in tests/fixtures/.

git does not keep the symlinks sysfs is made of well across platforms, so the host is
described in YAML (`tests/fixtures/two_socket_8gpu.yaml`) and written out here into a
temporary directory, the way node_exporter unpacks its text archive before its tests:

    <root>/sys/devices/pci0000:00/0000:00:01.0/.../0000:03:00.0/{vendor,class,...}
    <root>/sys/bus/pci/devices/0000:03:00.0 -> ../../../devices/pci0000:00/.../0000:03:00.0
    <root>/sys/devices/system/node/node0/{cpulist,numastat,meminfo,distance}
    <root>/proc/{vmstat,sys/kernel/numa_balancing,4242/{comm,status,numa_maps}}
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

FIXTURES = Path(__file__).parent / "fixtures"
TWO_SOCKET_HOST = FIXTURES / "two_socket_8gpu.yaml"
ENGINE_PID = 4242


@dataclass(frozen=True, slots=True)
class HostRoots:
    sysfs: Path
    procfs: Path


def load_description(path: Path = TWO_SOCKET_HOST) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def write_host(root: Path, description: dict | None = None, *, numa_node_unknown: bool = False) -> HostRoots:
    """Write the host into root/sys and root/proc. With numa_node_unknown every PCI
    device's numa_node reads -1, as on VMs that do not expose PCI NUMA affinity."""
    description = description if description is not None else load_description()
    sysfs, procfs = root / "sys", root / "proc"
    nodes = description.get("nodes", {})
    for bridge in description.get("pci", []):
        node = bridge["node"]
        defaults = {
            "numa_node": "-1" if numa_node_unknown else str(node),
            "local_cpulist": nodes[node]["cpulist"],
        }
        bridge_dir = sysfs / "devices" / bridge["host_bridge"]
        bridge_dir.mkdir(parents=True, exist_ok=True)
        for device in bridge.get("devices", []):
            _write_pci_device(sysfs, bridge_dir, device, defaults)
    _write_nodes(sysfs, nodes)
    for relative, content in description.get("proc", {}).items():
        _write_file(procfs / str(relative), content)
    return HostRoots(sysfs=sysfs, procfs=procfs)


def _write_pci_device(sysfs: Path, parent_dir: Path, device: dict, defaults: dict) -> None:
    device_dir = parent_dir / device["bdf"]
    device_dir.mkdir(parents=True)
    for name, content in {**defaults, **device.get("files", {})}.items():
        _write_file(device_dir / name, content)
    link = sysfs / "bus" / "pci" / "devices" / device["bdf"]
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(device_dir, link.parent), link)
    for child in device.get("children", []):
        _write_pci_device(sysfs, device_dir, child, defaults)


def _write_nodes(sysfs: Path, nodes: dict) -> None:
    node_root = sysfs / "devices" / "system" / "node"
    for node, files in nodes.items():
        for name, content in files.items():
            _write_file(node_root / f"node{node}" / name, content)
    if nodes:
        ids = sorted(int(n) for n in nodes)
        span = f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else f"{ids[0]}"
        for name in ("online", "possible", "has_cpu", "has_memory"):
            _write_file(node_root / name, span)


def _write_file(path: Path, content) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = str(content)
    path.write_text(text if text.endswith("\n") else text + "\n")


# ---- golden files ----

UPDATE_GOLDEN_ENV = "INFERD_UPDATE_GOLDEN"
# Values that differ on every run of the same inputs: how long something took and when
# it happened. Golden files keep their series (so a missing one is still caught) with
# the value 0.0; a sample's own timestamp, if any, is dropped.
# The process's own readings (client_python's default collectors) change from run to run too.
_VOLATILE_NAME = re.compile(r"_(duration_seconds|timestamp_seconds)$|^process_|^python_gc_")
_SAMPLE_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{.*\})? (?P<value>\S+)(?: -?\d+)?$")


def without_volatile_values(exposition: str) -> str:
    """The exposition with every volatile sample's value (see _VOLATILE_NAME) read as 0.0,
    python_info without its labels (the interpreter's version) and sample timestamps
    dropped; everything else byte for byte."""
    lines = []
    for line in exposition.splitlines(keepends=True):
        match = None if line.startswith("#") else _SAMPLE_LINE.match(line.rstrip("\n"))
        if match:
            value = "0.0" if _VOLATILE_NAME.search(match["name"]) else match["value"]
            labels = "" if match["name"] == "python_info" else match["labels"]  # the interpreter's version
            line = f"{match['name']}{labels or ''} {value}\n"
        lines.append(line)
    return "".join(lines)


def scrape(*collectors) -> str:
    """The exposition /metrics would serve for a CollectorSet of these collectors
    (exporters.exposition), volatile values removed (without_volatile_values)."""
    from inferd.exporters.exposition import render_exposition
    from inferd.exporters.registry import CollectorSet

    return without_volatile_values(render_exposition(CollectorSet(collectors).collect()).decode())


def samples(exposition: str, name: str) -> dict[tuple, float]:
    """{sorted label items: value} for one sample name in an exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def assert_matches_golden(actual: str, golden: Path) -> None:
    """Compare with the golden file; INFERD_UPDATE_GOLDEN=1 rewrites it instead."""
    if os.environ.get(UPDATE_GOLDEN_ENV) == "1":
        golden.write_text(actual)
        return
    if not golden.exists():
        raise AssertionError(f"golden file {golden} missing; run with {UPDATE_GOLDEN_ENV}=1 to create it")
    expected = golden.read_text()
    if actual != expected:
        diff = "\n".join(
            difflib.unified_diff(expected.splitlines(), actual.splitlines(), str(golden), "actual", lineterm="", n=1)
        )
        raise AssertionError(f"output differs from {golden} (rerun with {UPDATE_GOLDEN_ENV}=1 if intended):\n{diff}")


def promtool_check_metrics(exposition: str) -> str:
    """Run `promtool check metrics` on the text; returns its problem report (empty when
    clean). Skips the calling test when promtool is not installed."""
    import shutil
    import subprocess

    import pytest

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=60
    )
    return (result.stdout + result.stderr).strip()
