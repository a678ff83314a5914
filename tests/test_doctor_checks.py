"""`inferd doctor` on fixture nodes: a healthy node where no check fires, and one node per
fault where its check must (doctor_nodes.py builds them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doctor_nodes import (
    ENGINE_CONFIG,
    FakeHttp,
    agent_metrics,
    agent_server,
    config_space,
    engine_metrics,
    engine_server,
    gpu_replay,
    healthy_description,
    set_files,
    write_node,
)

from inferd.agent.doctor import kv_cache, pcie
from inferd.agent.doctor.inputs import DoctorOptions, gather
from inferd.agent.doctor.runner import run_checks
from inferd.exporters.pcie_parsers import parse_pcie_capability

from fixture_trees import ENGINE_PID

WINDOW = 900.0
SERVE_RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "2026-11-29-cpu-serve-load.json"


@pytest.fixture(autouse=True)
def admin_token(monkeypatch):
    monkeypatch.setenv("INFERD_ADMIN_TOKEN", "doctor-test-token")


def diagnose(roots, replay, engine=None, agent=None, prometheus=None, **options):
    opts = DoctorOptions(
        agent_url=agent.url if agent else None,
        engine_url=engine.url if engine else None,
        prometheus_url=prometheus.url if prometheus else None,
        since_s=WINDOW,
        sysfs_root=str(roots.sysfs),
        procfs_root=str(roots.procfs),
        gpu_backend=f"replay:{replay}",
        engine_pid=ENGINE_PID,
        **options,
    )
    findings = run_checks(gather(opts))
    return {f.id: f for f in findings}


def bad(findings) -> dict[str, str]:
    return {fid: f.status for fid, f in findings.items() if f.status in ("warn", "fail")}


@pytest.fixture
def healthy(tmp_path):
    return write_node(tmp_path / "host"), gpu_replay(tmp_path / "gpus.json")


def test_healthy_node_raises_nothing_and_every_skip_says_why(healthy):
    roots, replay = healthy
    with engine_server() as engine, agent_server() as agent:
        findings = diagnose(roots, replay, engine, agent)
    assert bad(findings) == {}
    for check in ("placement", "pcie", "gpu_health", "engine", "kv_cache", "saturation", "configuration"):
        assert any(f.check == check for f in findings.values()), check
    must_be_ok = [
        "placement.engine",
        "pcie.link",
        "pcie.errors",
        "pcie.payload",
        "gpu_health.throttle",
        "gpu_health.xid",
        "gpu_health.memory",
        "engine.fast_path",
        "engine.regime",
        "kv_cache.fragmentation",
        "configuration.kv_capacity",
        "configuration.swap_pool",
        "configuration.cpu_governor",
    ]
    assert {fid: findings[fid].status for fid in must_be_ok} == {fid: "ok" for fid in must_be_ok}
    assert all(f.reason for f in findings.values() if f.status == "skip")
    assert "memory-bound" in findings["engine.regime"].summary


def test_engine_bound_to_the_far_socket_fails_placement(tmp_path):
    d = healthy_description()
    status = d["proc"]["4242/status"]
    d["proc"]["4242/status"] = status.replace(
        "Cpus_allowed_list:\t0-15,32-47", "Cpus_allowed_list:\t16-31,48-63"
    ).replace("Mems_allowed_list:\t0", "Mems_allowed_list:\t1")
    d["proc"]["4242/numa_maps"] = "7f1c00000000 bind:1 anon=524288 dirty=524288 N1=524288 kernelpagesize_kB=4\n"
    findings = diagnose(write_node(tmp_path / "host", d), gpu_replay(tmp_path / "gpus.json"))
    placement = findings["placement.engine"]
    assert placement.status == "fail"
    assert "100% of its CPUs are off node 0" in placement.summary
    assert "not node 0" in placement.summary and "100% of its pages are off node 0" in placement.summary
    assert "numactl --cpunodebind=0 --membind=0" in placement.fix
    sources = {e.name: e.source for e in placement.evidence}
    assert sources["cpus_allowed"].endswith("/4242/status")


def test_engine_on_far_gpus_is_judged_against_their_node(tmp_path):
    """The same node-0 binding is right for GPUs 0,1 and wrong for GPUs 4,5 (node 1)."""
    roots = write_node(tmp_path / "host", environ={"CUDA_VISIBLE_DEVICES": "4,5"})
    findings = diagnose(roots, gpu_replay(tmp_path / "gpus.json"), only=("placement",))
    assert findings["placement.engine"].status == "fail"
    assert "node 1" in findings["placement.engine"].summary


def test_x8_hop_under_an_x16_gpu_fails_the_link_check(tmp_path):
    d = set_files(healthy_description(), "0000:81:00.0", current_link_width="8")  # GPU4/5's switch upstream port
    findings = diagnose(write_node(tmp_path / "host", d), gpu_replay(tmp_path / "gpus.json"), only=("pcie",))
    link = findings["pcie.link"]
    assert link.status == "fail"
    assert "0000:81:00.0 at Gen5 x8 (max Gen5 x16)" in link.summary and "50%" in link.summary
    assert any(e.source.startswith("sysfs:") and "0000:81:00.0" in e.source for e in link.evidence)


def test_gen_drop_that_keeps_most_bandwidth_only_warns(tmp_path):
    d = set_files(healthy_description(), "0000:c4:00.0", current_link_speed="16.0 GT/s PCIe")
    d = set_files(d, "0000:c2:01.0", current_link_speed="16.0 GT/s PCIe")
    findings = diagnose(write_node(tmp_path / "host", d), gpu_replay(tmp_path / "gpus.json"), only=("pcie.link",))
    assert [(f.id, f.status) for f in findings.values()] == [("pcie.link", "fail")]  # Gen4 is half of Gen5
    d = set_files(healthy_description(), "0000:c4:00.0", current_link_width="15")
    findings = diagnose(write_node(tmp_path / "other", d), gpu_replay(tmp_path / "g.json"), only=("pcie.link",))
    assert findings["pcie.link"].status == "warn"


def aer_burst_answers(device: str) -> dict:
    window = f"{int(WINDOW)}s"
    aer = f"sum by (device, severity) (increase(inferd_pcie_aer_errors_total[{window}]))"
    return {
        aer: [
            ({"device": device, "severity": "correctable"}, lambda t, s, e: 0.0 if t < e - 120 else 240.0),
            ({"device": device, "severity": "nonfatal"}, lambda t, s, e: 0.0),
            ({"device": "0000:00:01.0", "severity": "correctable"}, lambda t, s, e: 0.0),
        ]
    }


def test_aer_burst_in_the_window_warns_and_names_the_device(healthy):
    roots, replay = healthy
    with FakeHttp(answers=aer_burst_answers("0000:07:00.0")) as prometheus:
        findings = diagnose(roots, replay, prometheus=prometheus, only=("pcie.errors",))
    errors = findings["pcie.errors"]
    assert errors.status == "warn"
    assert "16.0 correctable AER errors/min on 0000:07:00.0" in errors.summary
    assert any(e.source.startswith("prometheus:sum by (device, severity)") for e in errors.evidence)


def test_aer_counts_since_boot_without_prometheus_are_not_a_rate(tmp_path):
    """The base fixture's GPU2 has uncorrectable AER counts since boot: a warning that says
    it could not judge the rate."""
    d = healthy_description()
    base = set_files(d, "0000:07:00.0", aer_dev_nonfatal="Undefined 0\nDLP 2\nTOTAL_ERR_NONFATAL 2\n")
    findings = diagnose(write_node(tmp_path / "host", base), gpu_replay(tmp_path / "g.json"), only=("pcie.errors",))
    assert findings["pcie.errors"].status == "warn"
    assert findings["pcie.errors"].not_judged


def test_mps_mismatch_along_the_path_warns(tmp_path):
    configs = {"0000:06:00.0": config_space(mps=128)}  # GPU2's switch downstream port
    roots = write_node(tmp_path / "host", configs=configs)
    findings = diagnose(roots, gpu_replay(tmp_path / "gpus.json"), only=("pcie.payload",))
    payload = findings["pcie.payload"]
    assert payload.status == "warn"
    assert "GPU2 path: Max Payload Size differs along the path" in payload.summary
    assert "0000:06:00.0 128" in payload.summary and "0000:07:00.0 256" in payload.summary
    assert "GPU0" not in payload.summary


def test_small_read_requests_and_aspm_on_a_gpu_warn(tmp_path):
    configs = {"0000:03:00.0": config_space(mrrs=128, aspm_enabled=2)}
    findings = diagnose(
        write_node(tmp_path / "host", configs=configs), gpu_replay(tmp_path / "g.json"), only=("pcie.payload",)
    )
    summary = findings["pcie.payload"].summary
    assert "GPU0: Max Read Request Size 128 B" in summary and "GPU0: ASPM L1 enabled" in summary


def test_config_space_of_an_unprivileged_reader_skips_with_the_reason(tmp_path):
    configs = {}
    roots = write_node(tmp_path / "host")
    for link in (roots.sysfs / "bus" / "pci" / "devices").iterdir():
        configs[link.name] = config_space()[:64]
    roots = write_node(tmp_path / "other", configs=configs)
    findings = diagnose(roots, gpu_replay(tmp_path / "g.json"), only=("pcie.payload",))
    assert findings["pcie.payload"].status == "skip"
    assert "only the 64-byte header" in findings["pcie.payload"].reason


def test_capability_parser_reads_the_fields_and_refuses_loops():
    capability = parse_pcie_capability(config_space(mps=256, mps_supported=512, mrrs=1024, aspm_enabled=3))
    assert capability is not None
    assert (capability.mps_bytes, capability.mps_supported_bytes, capability.mrrs_bytes) == (256, 512, 1024)
    assert capability.aspm_enabled == ("L0s", "L1") and capability.aspm_supported == ("L0s", "L1")
    looped = bytearray(config_space())
    looped[0x41] = 0x40
    with pytest.raises(ValueError, match="loops"):
        parse_pcie_capability(bytes(looped))
    assert parse_pcie_capability(bytes(64)) is None  # no capability list
    with pytest.raises(ValueError, match="64"):
        parse_pcie_capability(b"\0" * 10)


def test_throttling_and_an_xid_in_a_gpu_replay_fail_gpu_health(tmp_path):
    def edit(snapshot: int, reading: dict) -> None:
        if reading["index"] == 3:
            reading["clocks_event_reasons"] = 0x40 | 0x4  # hardware thermal slowdown and power cap
        if reading["index"] == 5 and snapshot == 2:
            reading["xid_errors"] = [79]

    roots = write_node(tmp_path / "host")
    findings = diagnose(roots, gpu_replay(tmp_path / "gpus.json", edit), only=("gpu_health",))
    throttle, xid = findings["gpu_health.throttle"], findings["gpu_health.xid"]
    assert throttle.status == "fail"
    assert "GPU3 hw_thermal_slowdown in 100% of 5 readings" in throttle.summary
    assert "GPU3 sw_power_cap" in throttle.summary
    assert xid.status == "fail" and "GPU5: XID 79" in xid.summary and "critical: 79" in xid.summary
    assert findings["gpu_health.memory"].status == "ok"


def test_power_cap_alone_warns_and_pending_remap_warns(tmp_path):
    def edit(snapshot: int, reading: dict) -> None:
        if reading["index"] == 0:
            reading["clocks_event_reasons"] = 0x4
            reading["remapped_rows_pending"] = True

    findings = diagnose(write_node(tmp_path / "host"), gpu_replay(tmp_path / "g.json", edit), only=("gpu_health",))
    assert findings["gpu_health.throttle"].status == "warn"
    assert findings["gpu_health.memory"].status == "warn"


def test_replay_without_health_fields_skips_with_the_reason(tmp_path):
    from doctor_nodes import EIGHT_GPUS

    findings = diagnose(write_node(tmp_path / "host"), EIGHT_GPUS, only=("gpu_health.throttle",))
    assert findings["gpu_health.throttle"].status == "skip"
    assert "gives no clock event reasons" in findings["gpu_health.throttle"].reason


def thrashing_answers(window: str = f"{int(WINDOW)}s") -> dict:
    """A window where the pool is full and faults climb with the mean context length:
    the fit's samples follow lambda(L) = 0.05 (1 - exp(-L / 800))."""
    import math

    def length(t, s, e):  # mean context grows from 200 to 3200 tokens over the window
        return 200 + 3000 * (t - s) / (e - s)

    steps, running, block = 20.0, 160.0, 16

    def used_blocks(t, s, e):
        return length(t, s, e) * running / block

    def fault_rate(t, s, e):
        return 0.05 * (1 - math.exp(-length(t, s, e) / 800)) * steps * used_blocks(t, s, e)

    return {
        f"sum(increase(inferd_kv_page_faults_total[{window}]))": [({}, lambda t, s, e: 9000.0)],
        f"sum(increase(vllm:num_preemptions_total[{window}]))": [({}, lambda t, s, e: 450.0)],
        f"max(max_over_time(vllm:kv_cache_usage_perc[{window}]))": [({}, lambda t, s, e: 0.99)],
        kv_cache.FAULTS: [({}, fault_rate)],
        kv_cache.STEPS: [({}, lambda t, s, e: steps)],
        kv_cache.USED: [({}, used_blocks)],
        kv_cache.RUNNING: [({}, lambda t, s, e: running)],
    }


def test_thrashing_kv_window_fails_and_the_fit_recovers_the_window(healthy):
    roots, replay = healthy
    with engine_server(engine_metrics(usage=0.99)) as engine, FakeHttp(answers=thrashing_answers()) as prometheus:
        findings = diagnose(roots, replay, engine, prometheus=prometheus, only=("kv_cache",))
    thrashing = findings["kv_cache.thrashing"]
    assert thrashing.status == "fail"
    assert "10.00 page faults/s and 0.50 preemptions/s" in thrashing.summary and "99%" in thrashing.summary
    fit = findings["kv_cache.fault_fit"]
    assert fit.status == "ok", fit.reason
    values = {e.name: e.value for e in fit.evidence}
    assert values["alpha"] == pytest.approx(0.05, rel=0.01)
    assert values["beta"] == pytest.approx(1 / 800, rel=0.01)
    assert values["r2"] > 0.99


def test_fragmented_kv_and_a_fallback_engine_warn(healthy):
    roots, replay = healthy
    config = {**ENGINE_CONFIG, "config": {**ENGINE_CONFIG["config"], "mode": "fallback"}}
    config.update(path="portable", path_reason="mode is fallback")
    with engine_server(engine_metrics(fragmentation=0.45, failures=2), config) as engine:
        findings = diagnose(roots, replay, engine, only=("kv_cache", "engine"))
    assert findings["kv_cache.fragmentation"].status == "warn"
    fast = findings["engine.fast_path"]
    assert fast.status == "warn"
    assert "2 fast-path failure(s)" in fast.summary and "the portable path runs: mode is fallback" in fast.summary


def test_idle_gpu_with_a_queue_is_host_bound(healthy):
    roots, replay = healthy
    with (
        engine_server(engine_metrics(running=8, waiting=30)) as engine,
        agent_server(agent_metrics(sm=0.05, dram=0.03)) as agent,
    ):
        findings = diagnose(roots, replay, engine, agent, only=("engine.regime",))
    assert findings["engine.regime"].status == "warn"
    assert findings["engine.regime"].summary.startswith("host-bound: 38 request(s)")


def test_configuration_limits_against_the_pool(healthy):
    roots, replay = healthy
    with engine_server(max_model_len=1 << 20) as engine:
        findings = diagnose(roots, replay, engine, only=("configuration.kv_capacity",))
    assert findings["configuration.kv_capacity"].status == "fail"
    assert "max_model_len 1048576 exceeds the pool's 640000 tokens" in findings["configuration.kv_capacity"].summary
    config = {**ENGINE_CONFIG, "config": {**ENGINE_CONFIG["config"], "max_num_seqs": 1024}}
    with engine_server(config=config, max_model_len=32768) as engine:
        findings = diagnose(roots, replay, engine, only=("configuration.kv_capacity",))
    assert findings["configuration.kv_capacity"].status == "warn"
    assert "leaves 625 KV tokens a sequence" in findings["configuration.kv_capacity"].summary


def test_powersave_governor_and_a_pool_without_huge_pages_warn(tmp_path):
    d = healthy_description()
    d["nodes"][0]["meminfo"] = d["nodes"][0]["meminfo"].replace(
        "HugePages_Total:      512", "HugePages_Total:        0"
    )
    roots = write_node(tmp_path / "host", d, governor="powersave")
    (roots.sysfs / "kernel" / "mm" / "transparent_hugepage" / "enabled").write_text("always madvise [never]\n")
    with engine_server() as engine:
        findings = diagnose(roots, gpu_replay(tmp_path / "g.json"), engine, only=("configuration",))
    assert findings["configuration.cpu_governor"].status == "warn"
    assert "32 of the engine's 32 CPUs run powersave" in findings["configuration.cpu_governor"].summary
    assert findings["configuration.swap_pool"].status == "warn"
    assert "no huge pages on node 0" in findings["configuration.swap_pool"].summary


def test_shared_upstream_link_busy_from_two_gpus_at_once_warns(healthy):
    roots, replay = healthy
    expr = "sum by (pci_bus_id) (rate(inferd_pcie_tx_bytes_total[1m]))"
    answers = {
        expr: [
            ({"pci_bus_id": "00000000:03:00.0"}, lambda t, s, e: 30e9),
            ({"pci_bus_id": "00000000:04:00.0"}, lambda t, s, e: 28e9),
        ]
    }
    with FakeHttp(answers=answers) as prometheus:
        findings = diagnose(roots, replay, prometheus=prometheus, only=("pcie.shared",))
    shared = findings["pcie.shared"]
    assert shared.status == "warn"
    assert "0000:01:00.0 (tx 92% of 63.0 GB/s)" in shared.summary
    assert expr in prometheus.queries


def test_shared_upstream_link_used_by_one_gpu_at_a_time_is_ok(healthy):
    roots, replay = healthy
    expr = "sum by (pci_bus_id) (rate(inferd_pcie_tx_bytes_total[1m]))"
    answers = {
        expr: [
            ({"pci_bus_id": "00000000:03:00.0"}, lambda t, s, e: 60e9 if t < (s + e) / 2 else 0.0),
            ({"pci_bus_id": "00000000:04:00.0"}, lambda t, s, e: 0.0 if t < (s + e) / 2 else 60e9),
        ]
    }
    with FakeHttp(answers=answers) as prometheus:
        findings = diagnose(roots, replay, prometheus=prometheus, only=("pcie.shared",))
    assert findings["pcie.shared"].status == "ok"


def test_only_keeps_the_named_checks_and_refuses_unknown_ones(healthy):
    roots, replay = healthy
    findings = diagnose(roots, replay, only=("pcie.link", "gpu_health"))
    assert set(findings) == {"pcie.link", "gpu_health.throttle", "gpu_health.xid", "gpu_health.memory"}
    with pytest.raises(ValueError, match="unknown check"):
        diagnose(roots, replay, only=("pcei",))
    with pytest.raises(ValueError, match="no finding pcie.lnk; these checks give pcie.errors, pcie.link"):
        diagnose(roots, replay, only=("pcie.lnk",))


def test_pcie_checks_reuse_the_topology_helpers():
    assert pcie.degraded_hops.__module__ == "inferd.agent.topo_cmd"


def test_load_past_the_knee_of_a_recorded_sweep_fails(healthy, tmp_path):
    from inferd.agent.doctor import headroom as hr
    from inferd.agent.doctor import saturation

    roots, replay = healthy
    record = json.loads(SERVE_RESULTS.read_text())
    sweep = tmp_path / "sweep.json"
    sweep.write_text(
        json.dumps(
            {"figures": {"tiny": record["figures"]["tiny"], "level_columns": record["figures"]["level_columns"]}}
        )
    )
    window = f"{int(WINDOW)}s"
    step = f"sum(rate({hr.STEP_SUM}[{saturation.RATE}])) / sum(rate({hr.STEP_COUNT}[{saturation.RATE}]))"
    batch = f"sum(rate({hr.BATCH_SUM}[{saturation.RATE}])) / sum(rate({hr.BATCH_COUNT}[{saturation.RATE}]))"
    per_request = f"sum(increase({hr.GEN_SUM}[{window}])) / sum(increase({hr.GEN_COUNT}[{window}]))"

    def batch_size(t, s, e):  # the batch grows over the window; step time follows 10 ms + 0.5 ms x b
        return 4 + 28 * (t - s) / (e - s)

    answers = {
        f"sum(rate(vllm:request_success_total[{window}]))": [({}, lambda t, s, e: 9.0)],
        step: [({}, lambda t, s, e: 0.010 + 0.0005 * batch_size(t, s, e))],
        batch: [({}, batch_size)],
        per_request: [({}, lambda t, s, e: 100.0)],
    }
    with FakeHttp(answers=answers) as prometheus, engine_server() as engine:
        findings = diagnose(roots, replay, engine, prometheus=prometheus, only=("saturation",), sweep_path=str(sweep))
    knee = findings["saturation.knee"]
    assert knee.status == "fail"
    assert knee.summary.startswith("load 9 req/s is 112% of the knee at 8")
    assert "p99 latency x" in knee.summary
    room = findings["saturation.headroom"]
    # 100 ms SLO: b = 180 capped at max_num_seqs 64, t = 42 ms, 64 / 0.042 / 100 = 15.2 req/s, 9 in use
    values = {e.name: e.value for e in room.evidence}
    assert values["capacity_rps"] == pytest.approx(64 / 0.042 / 100, rel=1e-3)
    assert values["headroom_rps"] == pytest.approx(64 / 0.042 / 100 - 9, rel=1e-3)
    assert room.status == "ok"


def test_knee_from_the_prometheus_window_without_a_sweep(healthy):
    from inferd.agent.doctor import saturation

    roots, replay = healthy

    def concurrency(t, s, e):
        return 1 + 63 * (t - s) / (e - s)

    answers = {
        saturation.CONCURRENCY: [({}, concurrency)],
        saturation.TOKENS: [({}, lambda t, s, e: 40.0 * min(concurrency(t, s, e), 24))],
    }
    with FakeHttp(answers=answers) as prometheus, engine_server(engine_metrics(running=60, waiting=4)) as engine:
        findings = diagnose(roots, replay, engine, prometheus=prometheus, only=("saturation.knee",))
    knee = findings["saturation.knee"]
    values = {e.name: e.value for e in knee.evidence}
    assert 20 <= values["knee_load"] <= 32  # the bins straddle the bend at 24
    assert knee.status == "fail" and "requests in the engine" in knee.summary


def test_knee_without_data_says_no_data(healthy, tmp_path):
    from inferd.agent.doctor import saturation

    roots, replay = healthy
    with FakeHttp() as prometheus, engine_server() as engine:  # Prometheus answers, with no series
        knee = diagnose(roots, replay, engine, prometheus=prometheus, only=("saturation.knee",))["saturation.knee"]
    assert knee.status == "skip"
    assert knee.reason.startswith("no data: Prometheus has no ") and saturation.TOKENS in knee.reason
    assert "never stops rising" not in knee.reason
    sweep = tmp_path / "sweep.json"
    sweep.write_text('{"levels": []}')
    knee = diagnose(roots, replay, only=("saturation.knee",), sweep_path=str(sweep))["saturation.knee"]
    assert knee.reason == f"no data: sweep file {sweep} has no levels"
    two = [{"offered_rps": r, "output_tokens_per_s": 10.0 * r} for r in (1, 2)]
    sweep.write_text(json.dumps({"levels": two}))
    knee = diagnose(roots, replay, only=("saturation.knee",), sweep_path=str(sweep))["saturation.knee"]
    assert knee.reason == "too little data: 2 load level(s), a knee needs 3"


def test_nvml_back_end_reads_throttle_reasons_ecc_remaps_and_xids_for_gpu_health(tmp_path):
    from inferd.agent.doctor import gpu_health
    from inferd.agent.doctor.inputs import Inputs
    from inferd.agent.doctor.thresholds import DEFAULT
    from inferd.exporters.gpu_nvml import NvmlBackend

    from gpu_fake_nvml import FakeNvml

    fake = FakeNvml(num_gpus=2, gpm=False)
    fake.clock_reasons[1] = 0x8  # hardware slowdown
    fake.ecc_uncorrected[0] = 3
    fake.remapped_rows[1] = (0, 1, 1, 0)
    backend = NvmlBackend(nvml=fake)
    try:
        first = backend.read()  # registers the XID event sets
        fake.pending_xids[0] = [79, 13]
        second = backend.read()
        third = backend.read()
    finally:
        backend.close()
    assert [g.xid_errors for g in first.gpus] == [[], []]
    assert [g.xid_errors for g in second.gpus] == [[79, 13], []] and third.gpus[0].xid_errors == []
    assert second.gpus[1].clocks_event_reasons == 0x8 and second.gpus[0].ecc_uncorrected_volatile == 3
    assert (second.gpus[1].remapped_rows_pending, second.gpus[1].remapped_rows_failure) == (True, False)
    inputs = Inputs(DoctorOptions(), now=0.0, gpu_snapshots=[first, second, third], gpu_source="nvml")
    findings = {f.id: f for f in gpu_health.run(inputs, DEFAULT)}
    assert (
        findings["gpu_health.throttle"].status == "fail"
        and "GPU1 hw_slowdown" in findings["gpu_health.throttle"].summary
    )
    assert findings["gpu_health.xid"].summary.startswith("GPU0: XID 13, 79")
    memory = findings["gpu_health.memory"]
    assert memory.status == "fail" and "GPU0: 3 uncorrected ECC errors" in memory.summary
    assert "GPU1: row remapping pending" in memory.summary


def test_placement_uses_the_ebpf_allocations_where_numa_maps_is_unreadable(tmp_path):
    roots = write_node(tmp_path / "host")
    (roots.procfs / str(ENGINE_PID) / "numa_maps").unlink()
    allocs = "# TYPE inferd_ebpf_page_allocs_total counter\n" + "".join(
        f'inferd_ebpf_page_allocs_total{{comm="inferd-serve",locality="{loc}",node="{node}",pid="{ENGINE_PID}"}} {n}\n'
        for node, loc, n in ((0, "local", 300.0), (1, "remote", 700.0))
    )
    with agent_server(agent_metrics() + allocs) as agent:
        findings = diagnose(roots, gpu_replay(tmp_path / "g.json"), agent=agent, only=("placement",))
    placement = findings["placement.engine"]
    assert placement.status == "fail" and "70% of its pages are off node 0" in placement.summary
    assert any(e.source.endswith("inferd_ebpf_page_allocs_total") for e in placement.evidence)


def test_copy_shares_are_judged_against_the_link_and_the_dram_peak():
    from inferd.agent.doctor.copy_bandwidth import _one
    from inferd.agent.doctor.thresholds import DEFAULT

    link = 63.0e9  # Gen5 x16 after encoding
    good = _one(0, {"h2d": 55e9, "d2h": 54e9, "d2d": 4.1e12}, "NVIDIA H200", link, DEFAULT)
    assert good.status == "ok" and "h2d 55.0 GB/s (87%)" in good.summary and "d2d 4100.0 GB/s (85%)" in good.summary
    slow_host = _one(1, {"h2d": 26e9, "d2h": 45e9, "d2d": 4.1e12}, "NVIDIA H200", link, DEFAULT)
    assert slow_host.status == "fail" and "under 80%: d2h, h2d" in slow_host.summary  # 41% and 71%
    unknown = _one(2, {"h2d": 55e9, "d2h": 54e9, "d2d": 1e12}, "NVIDIA B300", link, DEFAULT)
    assert unknown.status == "ok" and unknown.not_judged == (
        "device copy against peak: no datasheet peak for 'NVIDIA B300'",
    )


def test_active_checks_skip_unless_asked_and_say_why_without_cuda(healthy):
    roots, replay = healthy
    assert diagnose(roots, replay, only=("copy_bandwidth",))["copy_bandwidth.all"].reason == (
        "loads the GPU and host: run with --active"
    )
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the copies would run")
    findings = diagnose(roots, replay, only=("copy_bandwidth",), active=True)
    assert findings["copy_bandwidth.all"].reason == "no CUDA device visible to torch"


def test_headroom_from_the_agent_is_reported_and_warns_near_capacity(healthy):
    roots, replay = healthy
    figures = (
        "# TYPE inferd_headroom_requests_per_second gauge\ninferd_headroom_requests_per_second {room}\n"
        "# TYPE inferd_headroom_capacity_requests_per_second gauge\ninferd_headroom_capacity_requests_per_second 20\n"
    )
    with agent_server(agent_metrics() + figures.format(room=12)) as agent:
        ok = diagnose(roots, replay, agent=agent, only=("saturation.headroom",))["saturation.headroom"]
    with agent_server(agent_metrics() + figures.format(room=1)) as agent:
        near = diagnose(roots, replay, agent=agent, only=("saturation.headroom",))["saturation.headroom"]
    assert ok.status == "ok" and ok.summary == "12 req/s of 20 req/s left at the agent's --headroom-step-slo"
    assert near.status == "warn" and "warn under 10% left" in near.summary


def test_a_finding_maker_fills_in_its_checks_id_layer_and_title():
    from inferd.agent.doctor.findings import Evidence, Finding, FindingMaker

    finding = FindingMaker("pcie", "pcie", {"link": "links at their ceiling"})
    evidence = [Evidence("hops", 3, "sysfs: paths")]
    assert finding.ok("link", "fine", evidence) == Finding(
        "pcie.link", "pcie", "pcie", "ok", "links at their ceiling", "fine", 0.0, tuple(evidence)
    )
    warn = finding("link", "warn", "slow", impact=0.2, fix="reseat", not_judged=["rates"], layer="gpu")
    assert (warn.id, warn.layer, warn.impact, warn.fix, warn.not_judged) == (
        "pcie.link",
        "gpu",
        0.2,
        "reseat",
        ("rates",),
    )
    skipped = finding.skip("link", "no sysfs")
    assert (skipped.status, skipped.reason, skipped.title) == ("skip", "no sysfs", "links at their ceiling")
    per_gpu = FindingMaker("copy_bandwidth", "gpu", "copy bandwidth")
    assert per_gpu.ok("gpu3", "fast").title == "copy bandwidth"
