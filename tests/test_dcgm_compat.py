"""dcgm-exporter compatibility: its host label either way, DCGM_FI_PROF_GR_ENGINE_ACTIVE,
and every counter of its default list that the agent claims."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from inferd.exporters import gpu as gpu_module
from inferd.exporters.gpu import HOST_LABELS, GpuCollector
from inferd.exporters.gpu_replay import ReplayBackend, load_replay, write_replay

GPU_FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
EIGHT_GPUS = GPU_FIXTURES / "eight_h200.json"
REFERENCE = Path(__file__).parent / "fixtures" / "reference" / "dcgm-exporter"  # README.md there: source, version


def by_family(collector) -> dict[str, list]:
    return {metric.name: metric.samples for metric in collector.collect()}


@pytest.mark.parametrize("host_label", HOST_LABELS)
def test_every_dcgm_series_carries_the_chosen_host_label(host_label):
    got = by_family(GpuCollector(ReplayBackend(EIGHT_GPUS), host_label=host_label))
    other = next(label for label in HOST_LABELS if label != host_label)
    dcgm = [s for name, samples in got.items() if name.startswith("DCGM_FI_") for s in samples]
    assert dcgm
    assert all(s.labels[host_label] == "gpu-node-8x" and other not in s.labels for s in dcgm)


def test_host_label_defaults_to_the_released_spelling_and_rejects_others():
    parser = argparse.ArgumentParser()
    gpu_module.add_arguments(parser)
    assert parser.parse_args([]).dcgm_host_label == "Hostname"
    assert parser.parse_args(["--dcgm-host-label", "hostname"]).dcgm_host_label == "hostname"
    with pytest.raises(SystemExit):
        parser.parse_args(["--dcgm-host-label", "host"])
    with pytest.raises(ValueError, match="dcgm host label"):
        GpuCollector(ReplayBackend(EIGHT_GPUS), host_label="HOSTNAME")


def test_gr_engine_active_comes_from_gpm_graphics_activity_carried_by_a_replay(tmp_path):
    snapshot = load_replay(GPU_FIXTURES / "h200_phases.json")[1]  # the matmul phase
    gpu = snapshot.gpus[0]
    assert gpu.gpm is not None and gpu.gpu_util_pct is not None
    recorded = dataclasses.replace(gpu, gpm={**gpu.gpm, "graphics_util_pct": 61.5})
    path = tmp_path / "replay.json"
    write_replay(path, [dataclasses.replace(snapshot, gpus=[recorded])])
    assert load_replay(path)[0].gpus[0].gpm["graphics_util_pct"] == 61.5  # the replay file carries it
    got = by_family(GpuCollector(ReplayBackend(path)))
    assert [s.value for s in got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]] == pytest.approx([0.615])


def test_gr_engine_active_without_gpm_is_nvml_utilization_as_a_ratio(tmp_path):
    snapshot = load_replay(GPU_FIXTURES / "h200_phases.json")[1]
    gpu = dataclasses.replace(snapshot.gpus[0], gpm=None, gpu_util_pct=42.0)
    path = tmp_path / "replay.json"
    write_replay(path, [dataclasses.replace(snapshot, gpus=[gpu])])
    got = by_family(GpuCollector(ReplayBackend(path)))
    assert [s.value for s in got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]] == pytest.approx([0.42])
    assert got["DCGM_FI_PROF_SM_ACTIVE"] == []  # no GPM: no SM activity to report


def test_gr_engine_active_is_in_dcgm_exporters_default_counters():
    path = REFERENCE / "default-counters.csv"
    defaults = set(re.findall(r"^\s*(DCGM_FI_[A-Z_]+)\s*,", path.read_text(), flags=re.M))
    got = by_family(GpuCollector(ReplayBackend(EIGHT_GPUS)))
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in defaults
    assert len(got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]) == 8
