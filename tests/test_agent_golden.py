"""The whole agent's /metrics on the fixture node against a golden file, the way
node_exporter's end-to-end test compares its whole output.

The agent runs as users run it (`inferd agent`, real HTTP) with --no-engine, the replay
GPU back end on tests/fixtures/gpu/eight_h200.json and the two-socket fixture sysfs and
procfs trees (tests/fixture_trees.py), without the eBPF collector (its probes attach to
the running kernel, so what it sees is this host's, not the fixture's). Its first scrape
is compared with tests/fixtures/agent.prom after fixture_trees.without_volatile_values:
durations (`*_duration_seconds`) and Unix times (`*_timestamp_seconds`) read 0.0 and
sample timestamps are dropped; every series stays. After an intended change, rewrite
the golden file with

    INFERD_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_agent_golden.py
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_agent import EIGHT_GPUS, REPO, Agent, free_port

from fixture_trees import FIXTURES, assert_matches_golden, promtool_check_metrics, without_volatile_values, write_host

GOLDEN = FIXTURES / "agent.prom"


@pytest.fixture
def fixture_host(tmp_path):
    return write_host(tmp_path / "host")


def test_whole_agent_scrape_matches_golden(fixture_host, tmp_path):
    agent = Agent(
        "--no-engine",
        "--gpu-backend",
        f"replay:{EIGHT_GPUS}",
        "--sysfs-root",
        str(fixture_host.sysfs),
        "--procfs-root",
        str(fixture_host.procfs),
        "--audit-log",
        str(tmp_path / "audit.jsonl"),
        "--prometheus-url",
        f"http://127.0.0.1:{free_port()}",
    )
    try:
        agent.wait_ready()
        text = agent.metrics()
    finally:
        assert agent.stop() == 0
    assert_matches_golden(without_volatile_values(text), GOLDEN)


def test_golden_passes_promtool():
    problems = promtool_check_metrics(GOLDEN.read_text())
    # dcgm-exporter's names (DCGM_FI_*, no _total on its counters) are kept on purpose
    assert [line for line in problems.splitlines() if not line.startswith("DCGM_FI_")] == []


def test_unknown_collector_name_is_an_error_naming_the_known_ones():
    result = subprocess.run(
        [sys.executable, "-m", "inferd.agent.cli", "agent", "--no-engine", "--no-collector", "pcei"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "argument --no-collector: invalid choice: 'pcei'" in result.stderr
    for name in ("gpu", "pcie", "numa", "ebpf", "engine", "otlp", "remediation"):
        assert f"'{name}'" in result.stderr
