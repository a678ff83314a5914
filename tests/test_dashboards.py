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

from inferd.dashboards import generate
from inferd.dashboards.boards import BOARDS
from inferd.dashboards.common import PROMETHEUS_UID, REMEDIATION_ANNOTATIONS
from inferd.dashboards.spec import REQUIREMENT_NOTES, Panel, Query, Threshold

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "dashboards" / "generated"


def load_boards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(GENERATED.glob("*.json"))}


def data_panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def test_committed_json_matches_generated():
    assert generate.drifted() == [], "run: python -m inferd.dashboards.generate"


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
    ebpf = {"inferd_ebpf_page_allocs", "inferd_ebpf_numa_hint_faults", "inferd_ebpf_probe_up"}  # exporters/ebpf_numa.py
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


# --- live: every expression against a real Prometheus scraping a real agent and engine ---

import json as _json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.parse  # noqa: E402
import urllib.request  # noqa: E402

from inferd.dashboards.promql import expand  # noqa: E402

from server_fixtures import live_stack_ports  # noqa: E402

REFERENCE = ROOT / "tests" / "fixtures" / "reference"  # README.md there: source, version
REPLAY = ROOT / "tests" / "fixtures" / "gpu" / "eight_h200.json"
PROM = "http://localhost:9090"
ENGINE = "http://localhost:8000"
LIVE_PORTS = (8000, 9090, 9093, 10400)
RATE_INTERVAL = "30s"  # Grafana's $__rate_interval for a 5 s scrape: max(4 x scrape, interval + scrape)


def _port_busy(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _get_json(url: str, data: bytes | None = None, timeout: float = 30) -> dict:
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return _json.load(response)


def _load(stop: threading.Event, errors: list[str]) -> None:
    """Completions with a shared prefix (prefix-cache hits) and varied lengths, streaming and not."""
    model = _get_json(f"{ENGINE}/v1/models")["data"][0]["id"]
    prefix = "The quick brown fox jumps over the lazy dog. " * 4
    i = 0
    while not stop.is_set():
        body = {"model": model, "prompt": prefix + f"request {i}", "max_tokens": 8 + (i % 3) * 8, "temperature": 0}
        try:
            _get_json(f"{ENGINE}/v1/completions", _json.dumps(body).encode(), timeout=60)
        except Exception as exc:
            errors.append(repr(exc))
        i += 1


def _post_alert(name: str) -> None:
    """A firing alert as Alertmanager would send it, so the remediation panels have an action to show."""
    import datetime
    import uuid

    from inferd.agent.stack import token_file

    now = datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    labels = {"alertname": name, "severity": "warning", "remediate": "true", "job": "inferd-engine"}
    payload = {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="{name}"}}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "inferd-agent",
        "groupLabels": {"alertname": name},
        "commonLabels": labels,
        "commonAnnotations": {},
        "externalURL": "http://localhost:9093",
        "alerts": [
            {
                "status": "firing",
                "labels": labels,
                "annotations": {"description": "test"},
                "startsAt": now,
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": uuid.uuid4().hex[:16],
            }
        ],
    }
    request = urllib.request.Request(
        "http://localhost:10400/v1/alerts",
        data=_json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token_file().read_text().strip()}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory):
    for binary in ("prometheus", "prometheus-alertmanager"):
        if shutil.which(binary) is None:
            pytest.skip(f"{binary} not installed (Debian package)")
    for module in ("agent/main.py", "engine/server"):
        if not (ROOT / module).exists():
            pytest.skip(f"{module} has not landed yet: `inferd agent` / `inferd serve` missing")
    with live_stack_ports():  # one live stack at a time, across xdist workers and test runs
        busy = [p for p in LIVE_PORTS if _port_busy(p)]
        if busy:
            pytest.skip(f"ports in use by something else: {busy}")
        run_dir = tmp_path_factory.mktemp("stack")
        # The two-socket eight-GPU sysfs tree, whose bus ids are the replay file's GPUs, so the
        # PCIe panels (sysfs links joined with NVML bytes) return data too.
        from fixture_trees import write_host

        roots = write_host(tmp_path_factory.mktemp("host"))
        cmd = [sys.executable, "-m", "inferd.agent.cli", "stack"]
        agent_args = [
            f"--agent-arg=--gpu-backend=replay:{REPLAY}",
            f"--agent-arg=--sysfs-root={roots.sysfs}",
            f"--agent-arg=--audit-log={run_dir / 'audit.jsonl'}",  # not the user's log and cooldowns
        ]
        up = subprocess.run(
            [*cmd, "up", "--run-dir", str(run_dir), "--timeout", "240", *agent_args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        try:
            assert up.returncode == 0, up.stdout + up.stderr
            stop, errors = threading.Event(), []
            workers = [threading.Thread(target=_load, args=(stop, errors)) for _ in range(4)]
            start = time.time()
            for w in workers:
                w.start()
            time.sleep(15)  # scraped a few times: the agent acts only with a baseline for its target
            _post_alert("InferdKVCacheThrashing")
            time.sleep(25)  # eight scrapes at 5 s in all: every rate over 30 s has samples
            stop.set()
            for w in workers:
                w.join(timeout=120)
            time.sleep(6)  # one more scrape after the load
            assert not errors, errors[:3]
            model = _get_json(f"{ENGINE}/v1/models")["data"][0]["id"]
            yield {"start": start, "end": time.time(), "model": model}
        finally:
            subprocess.run([*cmd, "down", "--run-dir", str(run_dir)], cwd=ROOT, capture_output=True, timeout=120)


def _has_data(expr: str, window: dict) -> bool:
    params = urllib.parse.urlencode({"query": expr, "start": window["start"], "end": window["end"], "step": 5})
    body = _get_json(f"{PROM}/api/v1/query_range?{params}")
    assert body["status"] == "success", (expr, body)
    return bool(body["data"]["result"])


def _present(metric: str, window: dict) -> bool:
    return _has_data(metric, window)


def _requirements_met(window: dict) -> dict[str, bool]:
    return {
        "gpu": _present("DCGM_FI_DEV_GPU_UTIL", window),
        "pcie-sysfs": _present("inferd_pcie_link_width", window),
        "aer": _present("inferd_pcie_aer_errors_total", window),
        "ebpf": _present("inferd_ebpf_probe_up == 1", window),
        "numa-binding": _present("inferd_numa_process_remote_ratio", window),
        "numa-balancing": _present("inferd_numa_balancing_enabled == 1", window),
        "fastpath": _present("inferd_engine_fastpath_failures_total", window),
        "remediation": _present("inferd_remediation_actions_total", window),
        "rollback": _present("inferd_remediation_rollbacks_total", window),
        "alert": _present('ALERTS{alertstate="firing", alertname=~"Inferd.*"}', window),
        "alert-pending": _present('ALERTS{alertstate="pending", alertname=~"Inferd.*"}', window),
        "slo-classes": _present('inferd_slo_requests_total{target="ttft"}', window),
    }


def _board_expressions() -> list[tuple[str, str, str | None]]:
    """(where, expr, requirement) for every panel target, annotation and variable query."""
    notes = {sentence: key for key, sentence in REQUIREMENT_NOTES.items()}
    out = []
    annotation_requires = {a.name: a.requires for a in REMEDIATION_ANNOTATIONS}
    for name, board in load_boards().items():
        for panel in data_panels(board):
            requirement = next(
                (key for sentence, key in notes.items() if panel["description"].endswith(sentence)), None
            )
            for target in panel["targets"]:
                out.append((f"{name} / {panel['title']}", target["expr"], requirement))
        for annotation in board["annotations"]["list"]:
            out.append(
                (
                    f"{name} / annotation {annotation['name']}",
                    annotation["expr"],
                    annotation_requires[annotation["name"]],
                )
            )
        for variable in board["templating"]["list"]:
            inner = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"])
            out.append(
                (f"{name} / variable {variable['name']}", inner.group(1), "gpu" if variable["name"] == "gpu" else None)
            )
    return out


@pytest.mark.slow
def test_every_board_expression_returns_data(live_stack):
    met = _requirements_met(live_stack)
    assert met["gpu"], "the replay GPU back end must make the GPU panels return data"
    assert met["pcie-sysfs"] and met["aer"], "the fixture sysfs tree must make the PCIe panels return data"
    assert met["remediation"], "the alert posted to the webhook must have led to an action"
    empty, skipped = [], []
    for where, expr, requirement in _board_expressions():
        if requirement and not met[requirement]:
            skipped.append(where)
            continue
        query = expand(expr, rate_interval=RATE_INTERVAL, interval="15s", range_="5m")
        if not _has_data(query, live_stack):
            empty.append(f"{where}: {query}")
    assert not empty, "no data:\n" + "\n".join(empty)
    # what was exempt, and why, is visible with -rA
    print(f"exempt (source absent here): {len(skipped)}: {sorted(set(skipped))}; met: {met}")


def _reference_queries(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("var "):  # template variable: its label_values() selector must match
            inner = re.search(r"label_values\((.+), \w+\)", line)
            if inner:
                out.append(inner.group(1))
            continue
        out.append(line.split(" | ")[2] if " | " in line else line)
    return out


# Queries of the reference boards for features inferd's engine does not have; each is
# listed with the reason, and a newly empty query not listed here fails the test.
NOT_APPLICABLE = {
    "vllm:external_prefix_cache": "no external KV connector",
    "vllm:mm_cache": "no multimodal inputs",
    'source="external_kv_transfer"': "no external KV connector",
    'finished_reason="error"': "no request has failed in the load (vLLM has no series either until one does)",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "source",
    ["vllm/dashboard_queries.txt", "vllm/dashboard_queries_overview.txt", "dcgm-exporter/dashboard_queries.txt"],
)
def test_reference_dashboards_queries_return_data(live_stack, source):
    path = REFERENCE / source
    variables = {"model_name": live_stack["model"], "ttft_slo": "1.0", "tpot_slo": "0.1"}
    empty = []
    for expr in _reference_queries(path):
        if any(key in expr for key in NOT_APPLICABLE):
            continue
        query = expand(expr, rate_interval=RATE_INTERVAL, interval="15s", range_="5m", variables=variables)
        if not _has_data(query, live_stack):
            empty.append(query)
    assert not empty, f"{len(empty)} reference queries return no data:\n" + "\n".join(empty)


def test_generated_boards_parse_back_through_the_sdk_models():
    from grafana_foundation_sdk.models.dashboard import Dashboard

    for name, board in load_boards().items():
        parsed = Dashboard.from_json(board)
        assert parsed.uid == name
        assert len(parsed.panels) == len(board["panels"])
        assert [v.name for v in parsed.templating.list_val] == [v["name"] for v in board["templating"]["list"]]


def test_engine_board_has_an_slo_row_by_class():
    board = load_boards()["inferd-engine"]
    assert "slo_class" in {v["name"] for v in board["templating"]["list"]}
    panels = {p["title"]: p for p in data_panels(board)}
    for title, metric in (
        ("TTFT attainment by class", "inferd_slo_requests_total"),
        ("Goodput by class", 'result="met"'),
        ("Shed requests by class and reason", "inferd_slo_requests_shed_total"),
        ("p99 time to first token by class", "inferd_slo_time_to_first_token_seconds_bucket"),
    ):
        expr = panels[title]["targets"][0]["expr"]
        assert metric in expr and "by (slo_class" in expr and 'slo_class=~"$slo_class"' in expr, title
    assert "reason" in panels["Shed requests by class and reason"]["targets"][0]["expr"]
