"""Boards as code: drift, completeness of every panel, and names against the metric contract.

The live check (every expression returns data from a real Prometheus scraping a real
agent and engine) is in tests/test_dashboards_live.py.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk not installed (pip install -e '.[test]')")

from dashboards import generate  # noqa: E402
from dashboards.boards import BOARDS  # noqa: E402
from dashboards.common import PROMETHEUS_UID  # noqa: E402
from dashboards.spec import REQUIREMENT_NOTES, Panel, Query, Threshold  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "dashboards" / "generated"


def load_boards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(GENERATED.glob("*.json"))}


def data_panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def test_committed_json_matches_generated():
    assert generate.drifted() == [], "run: python -m dashboards.generate"


def test_drift_check_notices_an_edited_file(tmp_path):
    for name, text in generate.render_all().items():
        (tmp_path / name).write_text(text)
    assert generate.drifted(tmp_path) == []
    victim = tmp_path / "inferd-engine.json"
    victim.write_text(victim.read_text().replace("Time to first token", "TTFT"))
    (tmp_path / "stale.json").write_text("{}")
    assert generate.drifted(tmp_path) == ["inferd-engine.json", "stale.json"]
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1


def test_the_four_boards_with_stable_uids():
    boards = load_boards()
    assert set(boards) == {"inferd-node", "inferd-numa", "inferd-engine", "inferd-remediation"}
    for name, board in boards.items():
        assert board["uid"] == name


@pytest.mark.parametrize("name", ["inferd-node", "inferd-numa", "inferd-engine", "inferd-remediation"])
def test_every_panel_has_title_unit_description_and_coloured_thresholds(name):
    board = load_boards()[name]
    panels = data_panels(board)
    assert panels
    for panel in panels:
        defaults = panel["fieldConfig"]["defaults"]
        assert panel["title"].strip(), panel
        assert panel["description"].strip(), panel["title"]
        assert defaults.get("unit"), panel["title"]
        steps = defaults["thresholds"]["steps"]
        assert steps[0]["value"] is None and all(s["color"] for s in steps), panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": PROMETHEUS_UID}
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("name", ["inferd-node", "inferd-numa", "inferd-engine", "inferd-remediation"])
def test_host_and_gpu_variables_and_remediation_annotations(name):
    board = load_boards()[name]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"host", "gpu"} <= set(variables)
    for v in variables.values():
        assert v["includeAll"] and v["allValue"] == ".*"
    annotations = {a["name"]: a for a in board["annotations"]["list"]}
    assert {"Remediation actions", "Rollbacks", "Firing alerts"} <= set(annotations)
    assert annotations["Remediation actions"]["useValueForTime"] is True


def test_thresholds_are_coloured_where_they_matter():
    boards = load_boards()
    panels = {p["title"]: p for b in boards.values() for p in data_panels(b)}
    for title in ("DRAM bandwidth utilisation", "KV cache usage", "Engine remote-memory share", "Temperature"):
        steps = panels[title]["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert [s["color"] for s in steps][-1] == "red", title
        assert len(steps) >= 3, title


def test_pcie_heatmaps_across_gpus():
    node = load_boards()["inferd-node"]
    heatmaps = {p["title"]: p for p in data_panels(node) if p["type"] == "heatmap"}
    assert {"PCIe TX share of link capacity", "PCIe RX share of link capacity"} <= set(heatmaps)
    for panel in heatmaps.values():
        assert panel["options"]["calculate"] is False
        assert "{{gpu}}" in panel["targets"][0]["legendFormat"]


def test_panel_requirements_are_written_in_the_description():
    for board in BOARDS:
        for panel in board.panels:
            if panel.requires:
                assert panel.full_description.endswith(REQUIREMENT_NOTES[panel.requires])


# Everything a board may select: the contract plus the dcgm-exporter names the GPU
# collector emits and Prometheus' own series.
def contract_names() -> set[str]:
    return set(re.findall(r"`((?:vllm:|inferd_)[a-z0-9_:]+)`", (ROOT / "docs" / "METRICS.md").read_text()))


METRIC_RE = re.compile(r"\b((?:vllm:|inferd_|DCGM_FI_)[A-Za-z0-9_:]+|ALERTS|up)\b")
SUFFIXES = ("_bucket", "_sum", "_count", "_total")


def base_name(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def test_every_metric_name_is_in_the_contract():
    contract = {base_name(n) for n in contract_names()}
    # The GPU collector's dcgm-exporter names (exporters/gpu.py), read from its source.
    dcgm = set(re.findall(r'"(DCGM_FI_[A-Z_]+)"', (ROOT / "exporters" / "gpu.py").read_text()))
    ebpf = {"inferd_ebpf_page_allocs", "inferd_ebpf_numa_hint_faults", "inferd_ebpf_probe_up"}  # issue 5
    unknown = set()
    for board in BOARDS:
        for panel in board.panels:
            for query in panel.queries:
                for name in METRIC_RE.findall(query.expr):
                    if name in ("ALERTS", "up") or name.startswith("DCGM_FI_") and name in dcgm:
                        continue
                    if base_name(name) not in contract | ebpf:
                        unknown.add((panel.title, name))
    assert not unknown, f"names missing from docs/METRICS.md: {sorted(unknown)}"


def test_spec_rejects_incomplete_panels():
    query = (Query("up"),)
    with pytest.raises(ValueError, match="unit is empty"):
        Panel("t", "d", "", query)
    with pytest.raises(ValueError, match="description is empty"):
        Panel("t", " ", "s", query)
    with pytest.raises(ValueError, match="no queries"):
        Panel("t", "d", "s", ())
    with pytest.raises(ValueError, match="ascending"):
        Panel("t", "d", "s", query, thresholds=(Threshold(None, "green"), Threshold(5, "red"), Threshold(1, "orange")))
    with pytest.raises(ValueError, match="requires"):
        Panel("t", "d", "s", query, requires="quantum")
