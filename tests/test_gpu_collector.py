"""GPU collector: replay golden files, dcgm-exporter compatibility, NVML back end on CPU."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pynvml as real_nvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferd.exporters import gpu_backends, gpu_nvml, gpu_reading, gpu_replay
from inferd.exporters.gpu import DCGM_LABELS, GpuCollector, WrappingCounters
from inferd.exporters.registry import CollectorUnavailable, SourceAbsent

from fixture_trees import assert_matches_golden, promtool_check_metrics, scrape
from gpu_fake_nvml import FakeNvml

GPU_FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
H200_PHASES = GPU_FIXTURES / "h200_phases.json"
EIGHT_GPUS = GPU_FIXTURES / "eight_h200.json"
MIB = 1024 * 1024


def samples(exposition: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_replay_matches_golden_for_each_recorded_h200_phase():
    phases = json.loads(H200_PHASES.read_text())["meta"]["phases"]
    collector = GpuCollector(gpu_replay.ReplayBackend(H200_PHASES))
    for phase in phases:
        assert_matches_golden(scrape(collector), GPU_FIXTURES / f"h200_{phase}.prom")


def test_eight_gpu_fixture_matches_golden():
    collector = GpuCollector(gpu_replay.ReplayBackend(EIGHT_GPUS))
    assert_matches_golden(scrape(collector), GPU_FIXTURES / "eight_h200.prom")


def test_golden_files_pass_promtool_for_inferd_families():
    problems = promtool_check_metrics((GPU_FIXTURES / "eight_h200.prom").read_text())
    inferd_problems = [line for line in problems.splitlines() if line.startswith("inferd_")]
    assert inferd_problems == []


def test_prof_values_are_ratios_and_bytes_per_second_as_dcgm_computes_them():
    snapshots = gpu_replay.load_replay(H200_PHASES)
    collector = GpuCollector(gpu_replay.ReplayBackend(H200_PHASES))
    for snapshot in snapshots:
        got = samples(scrape(collector))
        gpm = snapshot.gpus[0].gpm
        assert got["DCGM_FI_PROF_SM_ACTIVE"][0].value == pytest.approx(gpm["sm_util_pct"] / 100)
        assert got["DCGM_FI_PROF_DRAM_ACTIVE"][0].value == pytest.approx(gpm["dram_bw_util_pct"] / 100)
        assert got["DCGM_FI_PROF_PCIE_RX_BYTES"][0].value == pytest.approx(gpm["pcie_rx_mib_s"] * MIB)
        for name in (
            "DCGM_FI_PROF_SM_ACTIVE",
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_PROF_DRAM_ACTIVE",
        ):
            assert 0.0 <= got[name][0].value <= 1.0, name
        assert got["DCGM_FI_DEV_FB_USED"][0].value == snapshot.gpus[0].fb_used_bytes // MIB
        assert got["DCGM_FI_DEV_POWER_USAGE"][0].value == pytest.approx(snapshot.gpus[0].power_mw / 1000)


def test_every_dcgm_sample_carries_dcgm_exporter_labels():
    got = samples(scrape(GpuCollector(gpu_replay.ReplayBackend(EIGHT_GPUS))))
    dcgm = [s for name, ss in got.items() if name.startswith("DCGM_") for s in ss]
    assert dcgm
    for s in dcgm:
        assert set(s.labels) == set(DCGM_LABELS), s
    devices = {s.labels["device"] for s in got["DCGM_FI_DEV_GPU_TEMP"]}
    assert devices == {f"nvidia{i}" for i in range(8)}


def test_dcgm_exporter_dashboard_queries_find_their_series():
    text = (GPU_FIXTURES / "dcgm_dashboard_queries.txt").read_text()
    names = set(re.findall(r"\b(DCGM_FI_[A-Z_]+)\b", text))
    label_matchers = set(re.findall(r"(\w+)=~", text)) - {"instance"}  # Prometheus adds instance
    assert names and label_matchers == {"gpu"}
    got = samples(scrape(GpuCollector(gpu_replay.ReplayBackend(H200_PHASES))))
    for name in names:
        assert name in got, f"dashboard query needs {name}"
        assert all("gpu" in s.labels for s in got[name])


def test_replay_cycles_through_snapshots_and_wraps():
    backend = gpu_replay.ReplayBackend(H200_PHASES)
    count = len(backend.snapshots)
    seen = [backend.read().timestamp for _ in range(count + 1)]
    assert len(set(seen[:count])) == count
    assert seen[count] == seen[0]


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not JSON"),
        ('{"format": "other"}', "expected format"),
        ('{"format": "inferd-gpu-replay/1", "snapshots": []}', "no snapshots"),
        (
            '{"format": "inferd-gpu-replay/1", "snapshots": [{"timestamp": 1, "hostname": "h", '
            '"driver_version": "1", "gpus": [{"index": 0, "uuid": "GPU-1", "pci_bus_id": "b", '
            '"minor_number": 0, "name": "n", "bogus": 1}]}]}',
            "unknown GPU reading key(s) bogus;",
        ),
    ],
)
def test_bad_replay_file_gives_clear_error(tmp_path, content, message):
    path = tmp_path / "replay.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape(message)):
        gpu_replay.ReplayBackend(path)


def test_open_backend_rejects_unknown_spec():
    with pytest.raises(ValueError, match="unknown GPU back end 'cuda'"):
        gpu_backends.open_backend("cuda")


def test_nvml_backend_reports_the_source_absent_cleanly_without_a_gpu():
    try:
        backend = gpu_nvml.NvmlBackend()
    except CollectorUnavailable as exc:
        assert "NVML" in str(exc) or "nvidia-ml-py" in str(exc)
        if not isinstance(exc, SourceAbsent):
            pytest.skip(f"NVML's library is here but fails ({exc}); this test is for hosts without it")
    else:  # a machine with a GPU: the back end must work instead
        backend.close()
        pytest.skip("NVML works here; this test is for GPU-less machines")

    text = scrape(GpuCollector(gpu_backends.LazyBackend(gpu_nvml.NvmlBackend)))
    assert 'inferd_collector_up{collector="gpu"} 1.0' in text  # nothing failed: no GPU to read
    assert 'inferd_collector_source_absent{collector="gpu"} 1.0' in text
    assert "DCGM_FI" not in text


class DriverNotLoadedNvml(FakeNvml):
    def nvmlInit(self):
        raise real_nvml.NVMLError(real_nvml.NVML_ERROR_DRIVER_NOT_LOADED)


class NoGpuNvml(FakeNvml):
    def nvmlDeviceGetCount(self):
        return 0


def test_nvml_absent_library_or_no_gpu_is_absent_and_a_failing_driver_is_down():
    with pytest.raises(SourceAbsent, match="NVML not available"):
        gpu_nvml.NvmlBackend(nvml=FakeNvml(fail_init=True))  # NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(SourceAbsent, match="no GPU"):
        gpu_nvml.NvmlBackend(nvml=NoGpuNvml())
    with pytest.raises(CollectorUnavailable) as failed:
        gpu_nvml.NvmlBackend(nvml=DriverNotLoadedNvml())
    assert not isinstance(failed.value, SourceAbsent)

    absent = scrape(
        GpuCollector(gpu_backends.LazyBackend(lambda: gpu_nvml.NvmlBackend(nvml=FakeNvml(fail_init=True)), retry_s=60))
    )
    assert 'inferd_collector_up{collector="gpu"} 1.0' in absent
    assert 'inferd_collector_source_absent{collector="gpu"} 1.0' in absent
    lazy = gpu_backends.LazyBackend(lambda: gpu_nvml.NvmlBackend(nvml=DriverNotLoadedNvml()), retry_s=60)
    for _ in range(2):  # the second scrape raises the remembered reason, of the same kind
        down = scrape(GpuCollector(lazy))
        assert 'inferd_collector_up{collector="gpu"} 0.0' in down
        assert 'inferd_collector_source_absent{collector="gpu"} 0.0' in down


def test_nvml_backend_with_gpm_reads_every_value_and_honours_field_return_codes():
    fake = FakeNvml(
        num_gpus=2, unsupported_fields={gpu_reading.FIELD_PCIE_REPLAY_ROLLOVER, gpu_reading.FIELD_PCIE_LANE_ERRORS}
    )
    backend = gpu_nvml.NvmlBackend(gpm_interval_s=0.05, nvml=fake)
    try:
        deadline = time.monotonic() + 5
        while backend.read().gpus[1].gpm is None and time.monotonic() < deadline:
            time.sleep(0.02)
        got = samples(scrape(GpuCollector(backend)))
    finally:
        backend.close()
    assert not fake.initialised and fake.freed_samples == 4  # NVML shut down, 2 samples x 2 GPUs freed
    assert [s.value for s in got["DCGM_FI_PROF_SM_ACTIVE"]] == pytest.approx([0.78, 0.78])
    # GPM's graphics-engine activity (96 %), not utilization.gpu (97 %), where GPM runs
    assert [s.value for s in got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]] == pytest.approx([0.96, 0.96])
    assert [s.value for s in got["DCGM_FI_PROF_PCIE_RX_BYTES"]] == pytest.approx([2.5 * MIB] * 2)
    assert [s.labels["pci_bus_id"] for s in got["DCGM_FI_DEV_GPU_UTIL"]] == ["00000000:18:00.0", "00000000:19:00.0"]
    assert "inferd_pcie_replay_rollover_total" not in got  # NOT_SUPPORTED return code
    assert "inferd_pcie_lane_errors_total" not in got
    assert got["inferd_pcie_replay_total"][0].value == gpu_reading.FIELD_PCIE_REPLAY * 10
    assert {s.labels["type"] for s in got["inferd_pcie_link_errors_total"]} == set(
        gpu_reading.PCIE_ERROR_FIELDS.values()
    )
    assert got["DCGM_FI_DEV_FB_USED"][0].value == 1000  # whole MiB, as DCGM


def test_nvml_backend_without_gpm_falls_back_to_plain_utilisation():
    backend = gpu_nvml.NvmlBackend(gpm_interval_s=0.05, nvml=FakeNvml(num_gpus=1, gpm=False))
    try:
        got = samples(scrape(GpuCollector(backend)))
    finally:
        backend.close()
    assert "DCGM_FI_PROF_SM_ACTIVE" not in got
    assert got["DCGM_FI_DEV_GPU_UTIL"][0].value == 97
    assert got["DCGM_FI_PROF_PCIE_TX_BYTES"][0].value == 2048 * 1024  # nvmlDeviceGetPcieThroughput KB/s
    lanes = sorted(int(s.labels["lane"]) for s in got["inferd_pcie_lane_errors_total"])
    assert lanes == list(range(16))


def test_nvml_init_failure_is_unavailable_with_reason():
    with pytest.raises(CollectorUnavailable, match="NVML not available"):
        gpu_nvml.NvmlBackend(nvml=FakeNvml(fail_init=True))


def test_wrapping_counters_unwrap_32_bit_values():
    counters = WrappingCounters(bits=32)
    assert counters.update(("gpu", 197), 4_294_967_000) == 4_294_967_000
    assert counters.update(("gpu", 197), 100) == 4_294_967_000 + 396
    assert counters.update(("gpu", 197), 200) == 4_294_967_000 + 496
    assert counters.update(("other", 197), 5) == 5


def test_pcie_byte_counters_are_monotonic_across_the_recorded_wraps():
    # the real H200 recording wraps field 198 during the host-to-device copy
    collector = GpuCollector(gpu_replay.ReplayBackend(GPU_FIXTURES / "h200_record.json"))
    raw = [s.gpus[0].fields["198"] for s in collector.backend.snapshots]
    assert any(b < a for a, b in zip(raw, raw[1:])), "fixture should contain a wrap"
    values = [samples(scrape(collector))["inferd_pcie_rx_bytes_total"][0].value for _ in raw]
    assert values == sorted(values)


def test_gpu_record_writes_a_file_the_replay_backend_reads(tmp_path):
    from inferd.exporters.gpu_cmd import record

    backend = gpu_nvml.NvmlBackend(gpm_interval_s=0.02, nvml=FakeNvml(num_gpus=1))
    try:
        written = record(tmp_path / "rec.json", interval_s=0.02, count=3, backend=backend)
    finally:
        backend.close()
    assert written == 3
    replay = gpu_replay.ReplayBackend(tmp_path / "rec.json")
    assert len(replay.snapshots) == 3
    assert replay.read().gpus[0].name == "NVIDIA H200"


def test_scrape_does_not_wait_for_a_gpm_window():
    # a 60 s window: a read that waited for GPM would hang this test; instead the
    # first reads carry no GPM result and the PROF families are simply empty
    backend = gpu_nvml.NvmlBackend(gpm_interval_s=60.0, nvml=FakeNvml(num_gpus=1))
    try:
        reading = backend.read().gpus[0]
        got = samples(scrape(GpuCollector(backend)))
    finally:
        backend.close()
    assert reading.gpm is None
    assert "DCGM_FI_PROF_SM_ACTIVE" not in got
    assert got["DCGM_FI_DEV_GPU_UTIL"][0].value == 97
