"""The remediation rules' verification targets, evaluated by Prometheus' own engine
(promtool's PromQL unit tests) on recorded series."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from inferd.agent.remediation_rules import DEFAULT_RULES

SEL = 'job="inferd-engine",instance="node1:8000"'
LABELS = f"{{{SEL}}}"


def _evaluate(tmp_path, series: dict[str, str], query: str, expected: float) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    test = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": name, "values": values} for name, values in series.items()],
                "promql_expr_test": [
                    {"expr": query, "eval_time": "4m", "exp_samples": [{"labels": "{}", "value": expected}]}
                ],
            }
        ],
    }
    path = tmp_path / "targets_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)


def _ttft_target() -> str:
    return DEFAULT_RULES["InferdTTFTSLOBreach"].target.format(sel=SEL, engine=SEL, window="2m")


# Per 15 s: 2 requests' first tokens taking 1.5 s in all (mean 0.75 s).
TTFT_SERIES = {
    f"vllm:time_to_first_token_seconds_sum{LABELS}": "0+1.5x20",
    f"vllm:time_to_first_token_seconds_count{LABELS}": "0+2x20",
}


def test_with_slo_classes_the_ttft_target_is_the_share_that_missed(tmp_path):
    """9 of every 10 interactive requests met the target, 1 missed; a batch class has none."""
    series = {
        **TTFT_SERIES,
        f'inferd_slo_requests_total{{{SEL},slo_class="interactive",target="ttft",result="met"}}': "0+9x20",
        f'inferd_slo_requests_total{{{SEL},slo_class="interactive",target="ttft",result="missed"}}': "0+1x20",
        f'inferd_slo_requests_total{{{SEL},slo_class="interactive",target="tpot",result="missed"}}': "0+5x20",
    }
    run = _evaluate(tmp_path, series, _ttft_target(), 0.1)
    assert run.returncode == 0, run.stdout + run.stderr
    wrong = _evaluate(tmp_path, series, _ttft_target(), 0.75)  # the mean is not what it reads here
    assert wrong.returncode != 0


def test_without_slo_classes_the_ttft_target_is_the_mean(tmp_path):
    run = _evaluate(tmp_path, TTFT_SERIES, _ttft_target(), 0.75)
    assert run.returncode == 0, run.stdout + run.stderr


def test_another_engines_misses_are_not_counted(tmp_path):
    series = {
        **TTFT_SERIES,
        'inferd_slo_requests_total{job="inferd-engine",instance="node2:8000",slo_class="i",target="ttft",result="missed"}': "0+1x20",
    }
    run = _evaluate(tmp_path, series, _ttft_target(), 0.75)
    assert run.returncode == 0, run.stdout + run.stderr
