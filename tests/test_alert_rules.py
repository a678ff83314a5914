"""Alert rules and Alertmanager config: promtool / amtool checks, unit tests, drift."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "alerts"
SEVERITIES = {"info", "warning", "critical"}


def _load_render():
    spec = importlib.util.spec_from_file_location("alerts_render", ALERTS / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _load_render()


def _tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.skip(
            f"{name} not installed (Debian package {'prometheus' if name == 'promtool' else 'prometheus-alertmanager'})"
        )
    return path


def _rules(path: Path = ALERTS / "rules.yml") -> dict[str, dict]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def test_committed_files_match_the_templates():
    rendered = render.render(render.load_params())
    for name, text in rendered.items():
        assert (ALERTS / name).read_text() == text, f"alerts/{name} drifted: run .venv/bin/python alerts/render.py"


def test_promtool_check_rules():
    result = subprocess.run(
        [_tool("promtool"), "check", "rules", str(ALERTS / "rules.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 16 rules found" in result.stdout


def test_promtool_unit_tests_pass():
    result = subprocess.run(
        [_tool("promtool"), "test", "rules", str(ALERTS / "tests.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_unit_tests_catch_a_changed_threshold(tmp_path):
    params = render.apply_overrides(render.load_params(), ["thresholds.kv_page_fault_rate=50"])
    render.write(tmp_path, params)
    shutil.copy(ALERTS / "tests.yml", tmp_path / "tests.yml")
    result = subprocess.run(
        [_tool("promtool"), "test", "rules", str(tmp_path / "tests.yml")], capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "InferdKVCacheThrashing" in result.stdout + result.stderr


@pytest.mark.parametrize(
    "override, alert",
    [
        ("thresholds.slo_burn_fast=60", "InferdSLOBudgetBurnFast"),  # 50x no longer pages
        ("thresholds.slo_burn_slow=12", "InferdSLOBudgetBurnSlow"),  # node2's 10x no longer tickets
        ("thresholds.slo_ttft_objective=0.9", "InferdSLOBudgetBurnSlow"),  # a 10 % budget
        ("durations.slo_burn_slow_for=6h", "InferdSLOBudgetBurnSlow"),
    ],
)
def test_burn_rate_tests_catch_a_changed_threshold(tmp_path, override, alert):
    render.write(tmp_path, render.apply_overrides(render.load_params(), [override]))
    shutil.copy(ALERTS / "tests.yml", tmp_path / "tests.yml")
    result = subprocess.run(
        [_tool("promtool"), "test", "rules", str(tmp_path / "tests.yml")], capture_output=True, text=True
    )
    assert result.returncode != 0
    assert alert in result.stdout + result.stderr


def test_slo_objective_is_recorded():
    groups = yaml.safe_load((ALERTS / "rules.yml").read_text())["groups"]
    records = {r["record"]: r["expr"] for g in groups for r in g["rules"] if "record" in r}
    assert records == {
        "inferd_slo:ttft_objective": f"vector({render.load_params()['thresholds']['slo_ttft_objective']})"
    }


def test_every_alert_is_complete():
    rules = _rules()
    assert set(rules) == {
        "InferdKVCacheThrashing",
        "InferdKVSwapBound",
        "InferdKVFragmentationHigh",
        "InferdTTFTSLOBreach",
        "InferdGPUUnderutilizedWithQueue",
        "InferdGPUMemoryBandwidthSaturated",
        "InferdNUMARemoteMemoryHigh",
        "InferdPCIeLinkDegraded",
        "InferdPCIeBandwidthSaturated",
        "InferdEngineFastPathFailing",
        "InferdEngineDown",
        "InferdCollectorDown",
        "InferdPodNUMAMisaligned",
        "InferdSLOBudgetBurnFast",
        "InferdSLOBudgetBurnSlow",
    }
    for name, rule in rules.items():
        assert render.parse_duration(rule["for"]) > 0, name
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook"}, name
        assert "$value" in annotations["description"], f"{name}: description lacks the live value"
        assert "inferd" in annotations["runbook"], name


def test_remediate_label_matches_the_policy():
    from inferd.agent.remediation import DEFAULT_RULES

    remediated = {name for name, rule in _rules().items() if rule["labels"].get("remediate") == "true"}
    assert remediated == set(DEFAULT_RULES)
    assert {"InferdGPUMemoryBandwidthSaturated", "InferdCollectorDown"}.isdisjoint(remediated)


def test_every_alert_has_a_quiet_and_a_firing_case():
    suite = yaml.safe_load((ALERTS / "tests.yml").read_text())
    quiet, firing = set(), set()
    for case in suite["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
            for alert in check["exp_alerts"]:
                assert set(alert["exp_annotations"]) == {"summary", "description", "runbook"}
    assert quiet == firing == set(_rules())


def test_time_scale_changes_only_durations(tmp_path):
    params = render.load_params()
    fast = render.render(params, time_scale=1 / 30)["rules.yml"]
    normal = render.render(params)["rules.yml"]

    def strip(text: str) -> str:
        return re.sub(r"\b(?:\d+(?:ms|s|m|h))+\b|^# .*$", "D", text, flags=re.M)

    assert strip(fast) == strip(normal)
    assert _rules_from_text(fast)["InferdKVCacheThrashing"]["for"] == "4s"
    assert "[4s]" in _rules_from_text(fast)["InferdKVCacheThrashing"]["expr"]
    (tmp_path / "rules.yml").write_text(fast)
    result = subprocess.run(
        [_tool("promtool"), "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _rules_from_text(text: str) -> dict[str, dict]:
    return {r["alert"]: r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "alert" in r}


@pytest.mark.parametrize(
    "text, seconds",
    [("5m", 300), ("1h30m", 5400), ("500ms", 0.5), ("2s", 2), ("1d", 86400)],
)
def test_parse_duration(text, seconds):
    assert render.parse_duration(text) == seconds


@pytest.mark.parametrize("seconds, text", [(300, "5m"), (5400, "1h30m"), (0.5, "500ms"), (10, "10s"), (4.2, "4s200ms")])
def test_format_duration(seconds, text):
    assert render.format_duration(seconds) == text


@pytest.mark.parametrize("bad", ["", "5", "m5", "5 m", "5x"])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError, match="not a Prometheus duration"):
        render.parse_duration(bad)


def test_override_rejects_unknown_parameter():
    with pytest.raises(ValueError, match="no such parameter"):
        render.apply_overrides(render.load_params(), ["thresholds.nope=1"])


def test_amtool_check_config():
    result = subprocess.run(
        [_tool("amtool"), "check-config", str(ALERTS / "alertmanager.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "labels, receiver",
    [
        (["alertname=InferdKVCacheThrashing", "remediate=true", "severity=warning"], "inferd-agent"),
        (["alertname=InferdCollectorDown", "severity=info"], "default"),
        (["alertname=InferdGPUMemoryBandwidthSaturated", "remediate=false"], "default"),
    ],
)
def test_alertmanager_routes(labels, receiver):
    result = subprocess.run(
        [_tool("amtool"), "config", "routes", "test", f"--config.file={ALERTS / 'alertmanager.yml'}", *labels],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receiver


def test_alertmanager_sends_to_the_agent_with_a_token_file():
    config = yaml.safe_load((ALERTS / "alertmanager.yml").read_text())
    agent = next(r for r in config["receivers"] if r["name"] == "inferd-agent")
    hook = agent["webhook_configs"][0]
    assert hook["url"].endswith("/v1/alerts")
    assert hook["send_resolved"] is True
    assert hook["http_config"]["authorization"]["credentials_file"]
    assert config["route"]["routes"][0]["repeat_interval"] == "12h"


def test_every_metric_in_the_rules_is_in_the_contract():
    contract = (ROOT / "docs" / "METRICS.md").read_text()
    dcgm_fixture = ROOT / "tests" / "fixtures" / "gpu" / "eight_h200.prom"
    dcgm = set(re.findall(r"^(DCGM_FI_\w+)\{", dcgm_fixture.read_text(), re.M)) if dcgm_fixture.exists() else set()
    used = {name for rule in _rules().values() for name in re.findall(r"([A-Za-z_:][\w:]*)\{", rule["expr"])}
    assert used
    for name in sorted(used):
        if name == "up":
            continue
        if name.startswith("DCGM_FI_"):
            if dcgm:
                assert name in dcgm, f"{name} is not exported by the GPU collector (fixture {dcgm_fixture.name})"
            continue
        base = re.sub(r"_bucket$", "", name)
        assert f"`{base}`" in contract or f"`{base.removesuffix('_total')}`" in contract, (
            f"{name} is not in docs/METRICS.md"
        )


def test_policy_target_queries_are_valid_promql(tmp_path):
    from inferd.agent.remediation import DEFAULT_RULES

    targets = [
        r.target.format(sel='job="inferd-engine",instance="h:8000"', engine='job="inferd-engine"', window="120s")
        for r in DEFAULT_RULES.values()
        if r.target
    ]
    assert len(targets) == len(DEFAULT_RULES)
    path = tmp_path / "targets.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "targets",
                        "rules": [
                            {"record": f"inferd:remediation_target:{i}", "expr": expr} for i, expr in enumerate(targets)
                        ],
                    }
                ]
            }
        )
    )
    result = subprocess.run([_tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
