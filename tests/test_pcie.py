"""PCIe sysfs collector: parsers on strings, the full exposition on the two-socket
fixture host against tests/fixtures/pcie.prom, failure modes, and the real /sys."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from inferd.exporters.pcie import PcieCollector
from inferd.exporters.pcie_parsers import (
    generation_of,
    lane_bytes_per_second,
    link_capacity_bytes_per_second,
    nvml_bus_id,
    parse_aer_counters,
    parse_link_speed,
    parse_link_width,
)
from inferd.exporters.pcie_topology import LinkState, PciDevice, discover_gpu_paths, is_degraded, link_ceilings

from fixture_trees import FIXTURES, assert_matches_golden, promtool_check_metrics, samples, scrape, write_host

GOLDEN = FIXTURES / "pcie.prom"


@pytest.fixture
def host(tmp_path):
    return write_host(tmp_path)


def up_value(exposition: str, collector: str = "pcie") -> float:
    return samples(exposition, "inferd_collector_up")[(("collector", collector),)]


# ---- parsers ----


@pytest.mark.parametrize(
    "text, expected",
    [
        ("32.0 GT/s PCIe", 32.0),
        ("16.0 GT/s PCIe\n", 16.0),
        ("2.5 GT/s PCIe", 2.5),
        ("8 GT/s", 8.0),  # kernels before 4.19
        ("5.0 GT/s", 5.0),
        ("Unknown speed", None),
        ("Unknown", None),
    ],
)
def test_parse_link_speed(text, expected):
    assert parse_link_speed(text) == expected


def test_parse_link_speed_rejects_garbage_with_the_value():
    with pytest.raises(ValueError, match="fast"):
        parse_link_speed("fast")


def test_parse_link_width():
    assert parse_link_width("16\n") == 16
    assert parse_link_width("0") == 0
    with pytest.raises(ValueError, match="x16"):
        parse_link_width("x16")


def test_parse_aer_counters_drops_total_and_keeps_unnamed_bits():
    text = "RxErr 2\nBadTLP 0\ndev_cor_errs_bit[3] 5\nTOTAL_ERR_COR 7\n"
    assert parse_aer_counters(text) == {"RxErr": 2, "BadTLP": 0, "dev_cor_errs_bit[3]": 5}


def test_parse_aer_counters_rejects_malformed_line():
    with pytest.raises(ValueError, match="line 2"):
        parse_aer_counters("RxErr 1\nBadTLP many\n")


def test_lane_rates_follow_the_encoding_of_each_generation():
    assert lane_bytes_per_second(2.5) == pytest.approx(250e6)  # 8b/10b
    assert lane_bytes_per_second(5.0) == pytest.approx(500e6)
    assert lane_bytes_per_second(8.0) == pytest.approx(8e9 * 128 / 130 / 8)  # 128b/130b
    assert link_capacity_bytes_per_second(32.0, 16) == pytest.approx(16 * 32e9 * 128 / 130 / 8)
    assert link_capacity_bytes_per_second(32.0, 16) == pytest.approx(63.015e9, rel=1e-4)
    assert link_capacity_bytes_per_second(None, 16) is None


def test_generation_and_nvml_bus_id():
    assert [generation_of(s) for s in (2.5, 5.0, 8.0, 16.0, 32.0, 64.0)] == [1, 2, 3, 4, 5, 6]
    assert generation_of(None) is None
    assert nvml_bus_id("0000:c3:00.0") == "00000000:C3:00.0"
    assert nvml_bus_id("0000:00:06.0") == "00000000:00:06.0"
    with pytest.raises(ValueError, match="PCI address"):
        nvml_bus_id("c3:00.0")


def _dev(bdf, current_speed, max_speed, current_width, max_width):
    return PciDevice(
        bdf, 0x10DE, 0x2335, 0x030200, 0, (), LinkState(current_speed, max_speed, current_width, max_width)
    )


def test_link_ceiling_is_the_lower_end_so_a_gen5_gpu_in_a_gen4_slot_is_not_degraded():
    gpu = _dev("0000:03:00.0", 16.0, 32.0, 16, 16)
    port = _dev("0000:02:00.0", 16.0, 16.0, 16, 16)
    hops = (gpu, port)
    ceilings = link_ceilings(hops)
    assert ceilings == [(16.0, 16), (16.0, 16)]
    assert is_degraded(gpu.link, ceilings[0]) is False


def test_width_below_ceiling_is_degraded_and_missing_link_is_unknown():
    assert is_degraded(LinkState(32.0, 32.0, 8, 16), (32.0, 16)) is True
    assert is_degraded(LinkState(16.0, 32.0, 16, 16), (32.0, 16)) is True
    assert is_degraded(LinkState(None, None, None, None), (None, None)) is None


# ---- fixture host ----


def test_discovers_eight_gpus_in_bus_order_and_skips_nic_and_nvswitch(host):
    paths = discover_gpu_paths(host.sysfs)
    assert [p.gpu.bdf for p in paths] == [
        "0000:03:00.0",
        "0000:04:00.0",
        "0000:07:00.0",
        "0000:08:00.0",
        "0000:83:00.0",
        "0000:84:00.0",
        "0000:c3:00.0",
        "0000:c4:00.0",
    ]
    assert [p.index for p in paths] == list(range(8))
    assert [b.bdf for b in paths[5].bridges] == ["0000:82:01.0", "0000:81:00.0", "0000:80:01.0"]
    assert paths[5].host_bridge == "pci0000:80"


def test_full_exposition_matches_golden(host):
    assert_matches_golden(scrape(PcieCollector(host.sysfs)), GOLDEN)


def test_degraded_capacity_and_aer_values(host):
    out = scrape(PcieCollector(host.sysfs))
    assert up_value(out) == 1.0
    assert absent_value(out) == 0.0
    degraded = samples(out, "inferd_pcie_link_degraded")
    flagged = sorted((dict(k)["gpu"], dict(k)["hop"], dict(k)["device"]) for k, v in degraded.items() if v == 1.0)
    assert flagged == [("5", "0", "0000:84:00.0"), ("5", "1", "0000:82:01.0")]
    assert len(degraded) == 8 * 4

    capacity = {dict(k)["pci_bus_id"]: v for k, v in samples(out, "inferd_pcie_link_capacity_bytes_per_second").items()}
    assert capacity["00000000:84:00.0"] == pytest.approx(capacity["00000000:83:00.0"] / 2)
    assert capacity["00000000:C3:00.0"] == pytest.approx(63.015e9, rel=1e-4)

    aer = {
        (dict(k)["device"], dict(k)["severity"], dict(k)["error"]): v
        for k, v in samples(out, "inferd_pcie_aer_errors_total").items()
    }
    assert aer[("0000:07:00.0", "correctable", "RxErr")] == 12
    assert aer[("0000:07:00.0", "nonfatal", "CmpltTO")] == 2
    assert aer[("0000:00:03.0", "correctable", "BadDLLP")] == 4
    assert aer[("0000:03:00.0", "fatal", "MalfTLP")] == 0
    assert not any(error.startswith("TOTAL") for _, _, error in aer)
    assert not any(device in ("0000:09:00.0", "0000:0a:00.0") for device, _, _ in aer)


def test_golden_output_passes_promtool():
    problems = promtool_check_metrics(GOLDEN.read_text())
    assert [line for line in problems.splitlines() if line.startswith("inferd_")] == []


# ---- failure modes: collector down, scrape still fine ----


def test_missing_pci_bus_directory_reports_down(host):
    shutil.rmtree(host.sysfs / "bus")
    out = scrape(PcieCollector(host.sysfs))
    assert up_value(out) == 0.0
    assert absent_value(out) == 0.0
    assert "inferd_pcie_link_width" not in out


def absent_value(exposition: str, collector: str = "pcie") -> float:
    return samples(exposition, "inferd_collector_source_absent")[(("collector", collector),)]


def test_host_without_nvidia_gpu_reports_the_source_absent_not_down(host):
    for path in discover_gpu_paths(host.sysfs):
        (host.sysfs / "bus/pci/devices" / path.gpu.bdf / "vendor").write_text("0x1002\n")
    out = scrape(PcieCollector(host.sysfs))
    assert up_value(out) == 1.0  # nothing failed: there is nothing to read
    assert absent_value(out) == 1.0
    assert "inferd_pcie_link_width{" not in out


def test_malformed_link_file_reports_down_not_crash(host):
    (host.sysfs / "bus/pci/devices/0000:03:00.0/current_link_speed").write_text("garbage\n")
    out = scrape(PcieCollector(host.sysfs))
    assert up_value(out) == 0.0


def test_hop_without_link_files_is_skipped_not_fatal(host):
    for name in ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width"):
        (host.sysfs / "bus/pci/devices/0000:80:01.0" / name).unlink()
    out = scrape(PcieCollector(host.sysfs))
    assert up_value(out) == 1.0
    widths = samples(out, "inferd_pcie_link_width")
    assert not any(dict(k)["device"] == "0000:80:01.0" for k in widths)
    # the switch upstream port's link ceiling falls back to its own maximum
    degraded = samples(out, "inferd_pcie_link_degraded")
    assert degraded[(("device", "0000:81:00.0"), ("gpu", "4"), ("hop", "2"))] == 0.0


# ---- the real machine ----


def test_real_sysfs_scrape_succeeds():
    if not Path("/sys/bus/pci/devices").is_dir():
        pytest.skip("no /sys/bus/pci/devices on this machine")
    out = scrape(PcieCollector("/sys"))
    has_gpu = bool(discover_gpu_paths("/sys"))
    assert up_value(out) == 1.0  # a host without a GPU has nothing to read, which is no failure
    assert absent_value(out) == (0.0 if has_gpu else 1.0)


def test_collector_rereads_links_every_scrape_and_notices_removed_devices(host):
    collector = PcieCollector(host.sysfs)
    first = samples(scrape(collector), "inferd_pcie_link_width")
    key = (("device", "0000:03:00.0"), ("gpu", "0"), ("hop", "0"), ("kind", "current"))
    assert first[key] == 16
    (host.sysfs / "bus/pci/devices/0000:03:00.0/current_link_width").write_text("4\n")
    second = scrape(collector)
    assert samples(second, "inferd_pcie_link_width")[key] == 4
    assert samples(second, "inferd_pcie_link_degraded")[key[:3]] == 1.0

    (host.sysfs / "bus/pci/devices/0000:03:00.0").unlink()  # hot-removed GPU
    third = scrape(collector)
    gpus = {dict(k)["gpu"] for k in samples(third, "inferd_pcie_link_capacity_bytes_per_second")}
    assert gpus == {str(i) for i in range(7)}
    assert "0000:03:00.0" not in third.split("inferd_pcie_aer_errors_total")[0]
