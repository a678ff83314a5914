"""Topology discovery, placement and `inferd topo` on the fixture hosts and the real /sys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferd.agent.cli import main as inferd
from inferd.agent.placement import (
    CROSS_SOCKET_PENALTY,
    HOP_PENALTY,
    best_node_for_gpus,
    best_node_per_gpu,
    cross_factor,
    score,
    score_all,
)
from inferd.agent.topology import (
    NumaNode,
    connection_type,
    discover,
    node_of_cpus,
    parse_distances,
    parse_mem_total_bytes,
)

from fixture_trees import FIXTURES, assert_matches_golden, load_description, write_host

GOLDEN_JSON = FIXTURES / "topo.json"
GEN5_X16 = 16 * 32e9 * 128 / 130 / 8


@pytest.fixture
def host(tmp_path):
    return write_host(tmp_path)


@pytest.fixture
def topology(host):
    return discover(host.sysfs)


# ---- discovery ----


def test_gpu_paths_roles_and_nodes(topology):
    assert [g.index for g in topology.gpus] == list(range(8))
    assert [g.numa_node for g in topology.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {g.numa_node_source for g in topology.gpus} == {"numa_node"}
    gpu5 = topology.gpus[5]
    assert gpu5.pci_bus_id == "00000000:84:00.0"
    assert [(h.device, h.role) for h in gpu5.path] == [
        ("0000:84:00.0", "gpu"),
        ("0000:82:01.0", "switch_downstream_port"),
        ("0000:81:00.0", "switch_upstream_port"),
        ("0000:80:01.0", "root_port"),
    ]
    assert gpu5.root_port == "0000:80:01.0"
    assert gpu5.path[2].shared_by_gpus == (4, 5) and gpu5.path[2].is_shared_upstream
    assert not gpu5.path[3].is_shared_upstream  # the same link, seen from the root port
    assert [h.is_degraded for h in gpu5.path] == [True, True, False, False]
    assert gpu5.bottleneck_bytes_per_second == pytest.approx(GEN5_X16 / 2)
    assert topology.gpus[0].local_cpus == tuple(range(16)) + tuple(range(32, 48))
    assert [n.node for n in topology.nodes] == [0, 1]
    assert topology.node(1).distances == {0: 21, 1: 10}
    assert topology.node(0).mem_total_bytes == 1056462796 * 1024


def test_numa_node_minus_one_falls_back_to_local_cpulist(tmp_path):
    topology = discover(write_host(tmp_path, numa_node_unknown=True).sysfs)
    assert [g.numa_node for g in topology.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {g.numa_node_source for g in topology.gpus} == {"local_cpulist"}
    assert best_node_per_gpu(topology) == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}


def test_h200_vm_fixture_single_gpu_without_bridges(tmp_path):
    host = write_host(tmp_path, load_description(FIXTURES / "h200_vm.yaml"), numa_node_unknown=True)
    topology = discover(host.sysfs)
    (gpu,) = topology.gpus
    assert (gpu.device, gpu.pci_bus_id, gpu.root_port, gpu.num_hops) == ("0000:00:06.0", "00000000:00:06.0", None, 0)
    assert (gpu.numa_node, gpu.numa_node_source) == (0, "local_cpulist")
    assert gpu.path[0].is_degraded is False
    assert gpu.path[0].current_generation == 5
    assert best_node_for_gpus(topology) == 0


def test_node_of_cpus_picks_largest_overlap_and_refuses_ties():
    nodes = (NumaNode(0, (0, 1, 2, 3), None, {}), NumaNode(1, (4, 5, 6, 7), None, {}))
    assert node_of_cpus((0, 1, 2), nodes) == 0
    assert node_of_cpus((3, 4, 5), nodes) == 1
    assert node_of_cpus((0, 1, 4, 5), nodes) is None  # tie
    assert node_of_cpus((), nodes) is None
    assert node_of_cpus((9,), nodes) is None


def test_node_file_parsers():
    assert parse_distances("10 21", [0, 1]) == {0: 10, 1: 21}
    with pytest.raises(ValueError, match="2 nodes"):
        parse_distances("10", [0, 1])
    assert parse_mem_total_bytes("Node 0 MemTotal:       1024 kB\nNode 0 MemFree: 1 kB\n") == 1024 * 1024
    assert parse_mem_total_bytes("") is None


def test_connection_types_like_nvidia_smi(topology):
    gpus = topology.gpus
    assert connection_type(gpus[0], gpus[0]) == "X"
    assert connection_type(gpus[0], gpus[1]) == "PIX"  # same switch
    assert connection_type(gpus[0], gpus[2]) == "PHB"  # other root port, same host bridge
    assert connection_type(gpus[4], gpus[6]) == "NODE"  # other host bridge, same node
    assert connection_type(gpus[3], gpus[4]) == "SYS"  # other socket
    matrix = [[connection_type(a, b) for b in gpus] for a in gpus]
    assert all(matrix[i][j] == matrix[j][i] for i in range(8) for j in range(8))


# ---- placement ----


def test_placement_picks_each_gpus_own_socket(topology):
    assert best_node_per_gpu(topology) == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}


def test_score_formula(topology):
    gpu4, gpu5 = topology.gpus[4], topology.gpus[5]
    local = score(topology, gpu4, 1)
    assert local.score == pytest.approx(GEN5_X16 / 1e9 / (1 + HOP_PENALTY * 3))
    assert local.cross_factor == 1.0
    remote = score(topology, gpu4, 0)
    assert remote.cross_factor == pytest.approx(2.1)  # SLIT 21 / 10
    assert remote.score == pytest.approx(local.score / 2.1)
    assert score(topology, gpu5, 1).score == pytest.approx(local.score / 2)  # x8 link
    assert len(score_all(topology)) == 16


def test_cross_factor_without_distances_uses_default_penalty(host):
    for node in (0, 1):
        (host.sysfs / f"devices/system/node/node{node}/distance").unlink()
    topology = discover(host.sysfs)
    assert cross_factor(topology, topology.gpus[0], 1) == CROSS_SOCKET_PENALTY


def test_best_node_for_a_gpu_set(topology):
    assert best_node_for_gpus(topology, [4, 5]) == 1
    assert best_node_for_gpus(topology, [0, 1, 2, 3, 4, 5, 6, 7]) == 0  # GPU5's x8 link tips it
    assert best_node_for_gpus(topology, [0, 6, 7]) == 1
    with pytest.raises(ValueError, match=r"\[9\]"):
        best_node_for_gpus(topology, [1, 9])


def test_degraded_links_can_change_the_best_node_for_a_set(host):
    assert best_node_for_gpus(discover(host.sysfs), [3, 6, 7]) == 1
    for bdf in ("0000:c3:00.0", "0000:c2:00.0", "0000:c4:00.0", "0000:c2:01.0"):
        (host.sysfs / "bus/pci/devices" / bdf / "current_link_width").write_text("4\n")
    topology = discover(host.sysfs)
    assert best_node_for_gpus(topology, [3, 6, 7]) == 0
    assert best_node_per_gpu(topology)[6] == 1  # its own socket is still best for GPU6 alone


# ---- inferd topo ----


def test_topo_json_matches_golden(host, capsys):
    assert inferd(["topo", "--sysfs-root", str(host.sysfs), "--procfs-root", str(host.procfs), "--json"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out)
    assert report["placement"]["best_node_per_gpu"] == {"0": 0, "1": 0, "2": 0, "3": 0, "4": 1, "5": 1, "6": 1, "7": 1}
    assert [(d["gpu"], d["hop"]) for d in report["degraded_hops"]] == [(5, 0), (5, 1)]
    assert [s["gpus"] for s in report["shared_upstream_links"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert str(host.sysfs) not in out  # stable: no temporary paths in the JSON
    assert_matches_golden(out, GOLDEN_JSON)


def test_topo_text_tree_matrix_and_warnings(host, capsys):
    assert inferd(["topo", "--sysfs-root", str(host.sysfs)]) == 0
    out = capsys.readouterr().out
    assert "NUMA node 1: CPUs 16-31,48-63" in out
    assert "GPU5 0000:84:00.0  Gen5 x8 (max Gen5 x16) DEGRADED" in out
    assert "0000:81:00.0 switch upstream port  Gen5 x16  shared by GPUs 4,5" in out
    gpu_rows = [line.split() for line in out.splitlines() if line.startswith("GPU3 ")]
    assert gpu_rows[0][:9] == ["GPU3", "PHB", "PHB", "PIX", "X", "SYS", "SYS", "SYS", "SYS"]
    assert "DEGRADED  GPU5 hop 0 0000:84:00.0 (GPU): Gen5 x8, max Gen5 x16" in out
    assert "SHARED    0000:c1:00.0 (switch upstream port) carries GPU6, GPU7 upstream" in out
    assert "engine placement for all GPUs: NUMA node 0" in out


def test_topo_missing_sysfs_gives_clear_error(tmp_path, capsys):
    assert inferd(["topo", "--sysfs-root", str(tmp_path / "nope")]) == 1
    assert "--sysfs-root" in capsys.readouterr().err


def test_topo_on_this_machine(capsys):
    if not Path("/sys/bus/pci/devices").is_dir():
        pytest.skip("no /sys/bus/pci/devices on this machine")
    assert inferd(["topo"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Topology under /sys")
    assert inferd(["topo", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    if Path("/sys/devices/system/node/node0").is_dir():
        assert 0 in [n["node"] for n in report["topology"]["numa_nodes"]]
        assert "NUMA node 0: CPUs" in text


def test_nested_switches_give_pxb_and_alternating_port_roles(tmp_path):
    port = {"vendor": "0x1000", "device": "0xc030", "class": "0x060400"}
    gpu = {"vendor": "0x10de", "device": "0x2335", "class": "0x030200"}
    description = {
        "pci": [
            {
                "host_bridge": "pci0000:00",
                "node": 0,
                "devices": [
                    {
                        "bdf": "0000:00:01.0",
                        "files": port,
                        "children": [
                            {
                                "bdf": "0000:01:00.0",
                                "files": port,
                                "children": [
                                    {
                                        "bdf": "0000:02:00.0",
                                        "files": port,
                                        "children": [
                                            {
                                                "bdf": "0000:03:00.0",
                                                "files": port,
                                                "children": [
                                                    {
                                                        "bdf": "0000:04:00.0",
                                                        "files": port,
                                                        "children": [{"bdf": "0000:05:00.0", "files": gpu}],
                                                    }
                                                ],
                                            }
                                        ],
                                    },
                                    {
                                        "bdf": "0000:02:01.0",
                                        "files": port,
                                        "children": [{"bdf": "0000:06:00.0", "files": gpu}],
                                    },
                                ],
                            }
                        ],
                    }
                ],
            }
        ],
        "nodes": {0: {"cpulist": "0-3"}},
    }
    topology = discover(write_host(tmp_path, description).sysfs)
    deep, shallow = topology.gpus
    assert [h.role for h in deep.path] == [
        "gpu",
        "switch_downstream_port",
        "switch_upstream_port",
        "switch_downstream_port",
        "switch_upstream_port",
        "root_port",
    ]
    assert connection_type(deep, shallow) == "PXB"
    assert deep.bottleneck_bytes_per_second is None  # no link files in this tree
