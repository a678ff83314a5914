"""NUMA collector: parsers on strings, the full exposition on the fixture host against
tests/fixtures/numa.prom, failure modes, and the real /sys and /proc."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferd.exporters.numa import (
    NumaCollector,
    parse_numa_balancing,
    parse_numa_maps,
    parse_numastat,
    parse_status_field,
    parse_vmstat_numa,
    remote_ratio,
)
from inferd.exporters.sysfs import format_cpulist, parse_cpulist, parse_key_value_counts

from fixture_trees import (
    ENGINE_PID,
    FIXTURES,
    assert_matches_golden,
    promtool_check_metrics,
    samples,
    scrape,
    write_host,
)

GOLDEN = FIXTURES / "numa.prom"


@pytest.fixture
def host(tmp_path):
    return write_host(tmp_path)


def up_value(exposition: str) -> float:
    return samples(exposition, "inferd_collector_up")[(("collector", "numa"),)]


# ---- parsers ----


def test_parse_numastat_maps_fields_to_stat_labels():
    text = "numa_hit 10\nnuma_miss 2\nnuma_foreign 3\ninterleave_hit 4\nlocal_node 9\nother_node 1\n"
    assert parse_numastat(text) == {"hit": 10, "miss": 2, "foreign": 3, "interleave_hit": 4, "local": 9, "other": 1}


def test_parse_vmstat_numa_keeps_only_balancing_counters():
    text = "nr_free_pages 5\nnuma_hit 7\nnuma_hint_faults 11\nnuma_hint_faults_local 8\nnuma_pages_migrated 3\n"
    assert parse_vmstat_numa(text) == {"numa_hint_faults": 11, "numa_hint_faults_local": 8, "numa_pages_migrated": 3}
    assert parse_vmstat_numa("nr_free_pages 5\n") == {}


def test_parse_numa_maps_sums_nodes_and_scales_huge_pages():
    text = (
        "7f0000000000 bind:0 anon=30 dirty=30 N0=20 N1=10 kernelpagesize_kB=4\n"
        "7f1000000000 default file=/dev/hugepages/kv huge dirty=3 N1=3 kernelpagesize_kB=2048\n"
        "7f2000000000 default\n"
        "7ffd00000000 default stack anon=5 dirty=5 N0=5 kernelpagesize_kB=4\n"
    )
    assert parse_numa_maps(text, base_page_kib=4) == {0: 25, 1: 10 + 3 * 512}
    assert parse_numa_maps("") == {}
    with pytest.raises(ValueError, match="line 1"):
        parse_numa_maps("7f0 default N0=1 kernelpagesize_kB=big\n")
    with pytest.raises(ValueError, match="base_page_kib"):
        parse_numa_maps("", base_page_kib=0)


def test_parse_status_field_and_balancing():
    status = "Name:\tinferd-serve\nCpus_allowed_list:\t0-15,32-47\nMems_allowed_list:\t0\n"
    assert parse_status_field(status, "Mems_allowed_list") == "0"
    assert parse_status_field(status, "Cpus_allowed_list") == "0-15,32-47"
    assert parse_status_field(status, "VmRSS") is None
    assert parse_numa_balancing("1\n") is True
    assert parse_numa_balancing("2") is True  # memory tiering mode
    assert parse_numa_balancing("0") is False
    with pytest.raises(ValueError, match="numa_balancing"):
        parse_numa_balancing("on")


def test_remote_ratio():
    assert remote_ratio({0: 75, 1: 25}, bound_node=0) == pytest.approx(0.25)
    assert remote_ratio({0: 75, 1: 25}, bound_node=1) == pytest.approx(0.75)
    assert remote_ratio({0: 10}, bound_node=1) == 1.0
    assert remote_ratio({}, bound_node=0) is None


def test_cpulist_parsing():
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpulist("") == ()
    with pytest.raises(ValueError, match="5-2"):
        parse_cpulist("0,5-2")
    with pytest.raises(ValueError, match="CPU list"):
        parse_cpulist("a-b")


@given(st.sets(st.integers(min_value=0, max_value=300), max_size=60))
def test_cpulist_format_round_trips(cpus):
    assert parse_cpulist(format_cpulist(sorted(cpus))) == tuple(sorted(cpus))


def test_key_value_parser_names_the_source_on_error():
    with pytest.raises(ValueError, match="numastat line 2"):
        parse_key_value_counts("numa_hit 1\nnuma_miss\n", source="numastat")


# ---- fixture host ----


def test_full_exposition_matches_golden(host):
    collector = NumaCollector(host.sysfs, host.procfs, engine_pid_fn=lambda: ENGINE_PID, base_page_kib=4)
    assert_matches_golden(scrape(collector), GOLDEN)


def test_values_from_fixture(host):
    out = scrape(NumaCollector(host.sysfs, host.procfs, engine_pid_fn=lambda: ENGINE_PID, base_page_kib=4))
    assert up_value(out) == 1.0
    stat = samples(out, "inferd_numa_stat_pages_total")
    assert stat[(("node", "0"), ("stat", "miss"))] == 1843210
    assert stat[(("node", "1"), ("stat", "foreign"))] == 1843210
    assert len(stat) == 12
    assert samples(out, "inferd_numa_hint_faults_local_total") == {(): 801544}
    assert samples(out, "inferd_numa_balancing_enabled") == {(): 1.0}

    resident = {dict(k)["node"]: v for k, v in samples(out, "inferd_numa_process_resident_pages").items()}
    # node 0: 1024 + 38000 + 500000 + 51200 + 500 huge pages x 512 + 300 + 33
    assert resident == {"0": 846557, "1": 84592}
    remote = samples(out, "inferd_numa_process_remote_ratio")
    key = (("bound_node", "0"), ("comm", "inferd-serve"), ("pid", str(ENGINE_PID)))
    assert remote[key] == pytest.approx(84592 / (846557 + 84592))


def test_bound_node_from_supervisor_overrides_status(host):
    out = scrape(
        NumaCollector(
            host.sysfs, host.procfs, engine_pid_fn=lambda: ENGINE_PID, bound_node_fn=lambda: 1, base_page_kib=4
        )
    )
    remote = {dict(k)["bound_node"]: v for k, v in samples(out, "inferd_numa_process_remote_ratio").items()}
    assert remote == {"1": pytest.approx(846557 / (846557 + 84592))}


def test_unbound_engine_has_pages_but_no_remote_ratio(host):
    status = host.procfs / str(ENGINE_PID) / "status"
    status.write_text(status.read_text().replace("Mems_allowed_list:\t0", "Mems_allowed_list:\t0-1"))
    out = scrape(NumaCollector(host.sysfs, host.procfs, engine_pid_fn=lambda: ENGINE_PID, base_page_kib=4))
    assert len(samples(out, "inferd_numa_process_resident_pages")) == 2
    assert samples(out, "inferd_numa_process_remote_ratio") == {}


def test_no_engine_or_exited_engine_omits_process_metrics(host):
    for pid_fn in (None, lambda: None, lambda: 999999):
        out = scrape(NumaCollector(host.sysfs, host.procfs, engine_pid_fn=pid_fn))
        assert up_value(out) == 1.0
        assert "inferd_numa_process_resident_pages" not in out
        assert "inferd_numa_stat_pages_total" in out


def test_golden_output_passes_promtool():
    problems = promtool_check_metrics(GOLDEN.read_text())
    assert [line for line in problems.splitlines() if line.startswith("inferd_")] == []


# ---- failure modes ----


def test_missing_numastat_reports_down(host):
    (host.sysfs / "devices/system/node/node1/numastat").unlink()
    out = scrape(NumaCollector(host.sysfs, host.procfs))
    assert up_value(out) == 0.0
    assert "inferd_numa_stat_pages_total" not in out


def test_missing_node_directory_reports_down(host):
    shutil.rmtree(host.sysfs / "devices/system/node")
    assert up_value(scrape(NumaCollector(host.sysfs, host.procfs))) == 0.0


def test_missing_vmstat_reports_down(host):
    (host.procfs / "vmstat").unlink()
    assert up_value(scrape(NumaCollector(host.sysfs, host.procfs))) == 0.0


def test_kernel_without_numa_balancing_omits_those_families(host):
    (host.procfs / "sys/kernel/numa_balancing").unlink()
    vmstat = host.procfs / "vmstat"
    vmstat.write_text(
        "".join(
            line + "\n"
            for line in vmstat.read_text().splitlines()
            if "hint_faults" not in line and "pages_migrated" not in line
        )
    )
    out = scrape(NumaCollector(host.sysfs, host.procfs))
    assert up_value(out) == 1.0
    assert "inferd_numa_hint_faults_total" not in out
    assert "inferd_numa_balancing_enabled" not in out


def test_rejects_bad_page_size():
    with pytest.raises(ValueError, match="base_page_kib"):
        NumaCollector(base_page_kib=0)


# ---- the real machine ----


def test_real_sys_and_proc():
    if not Path("/sys/devices/system/node/node0").is_dir():
        pytest.skip("this kernel exposes no NUMA node directory (/sys/devices/system/node/node0)")
    out = scrape(NumaCollector("/sys", "/proc", engine_pid_fn=os.getpid))
    assert up_value(out) == 1.0
    nodes = {dict(k)["node"] for k in samples(out, "inferd_numa_stat_pages_total")}
    assert "0" in nodes
    resident = {dict(k)["node"]: v for k, v in samples(out, "inferd_numa_process_resident_pages").items()}
    assert sum(resident.values()) > 0  # this test process has resident pages somewhere
