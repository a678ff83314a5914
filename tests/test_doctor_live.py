"""`inferd doctor` against a real agent supervising a real engine on this CPU machine:
every finding is ok or a skip with its reason (no GPU, no NVML, no Prometheus here)."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest
from test_agent import REPO, Agent, free_port, get, wait_for

from inferd.agent.doctor.schema import SCHEMA

TOKEN = "doctor-live-token"


@pytest.mark.slow
def test_real_agent_and_engine_give_only_ok_and_skips_with_reasons(tiny_model, monkeypatch):
    monkeypatch.setenv("INFERD_ADMIN_TOKEN", TOKEN)  # the agent's engine inherits it
    engine_port = free_port()
    agent = Agent("--model", tiny_model, "--engine-port", str(engine_port), "--no-collector", "gpu")
    engine_url = f"http://127.0.0.1:{engine_port}"

    def engine_ready():
        try:
            return get(f"{engine_url}/ready", timeout=2)[0] == 200
        except OSError:
            return False

    def agent_sees_engine_pages():
        return "inferd_numa_process_resident_pages{" in agent.metrics()

    try:
        agent.wait_ready()
        assert wait_for(engine_ready, timeout=180), "inferd serve did not come up"
        assert wait_for(agent_sees_engine_pages, timeout=30)
        scraped = agent.metrics()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "inferd.agent.cli",
                "doctor",
                "--json",
                "--agent",
                agent.url,
                "--engine",
                engine_url,
                "--no-discover",  # no Prometheus: a stack on this node stays out of it
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        assert agent.stop() == 0
    assert 'inferd_collector_up{collector="headroom"} 1.0' in scraped  # the agent measures its engine
    assert "# TYPE inferd_headroom_requests_per_second gauge" in scraped
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    jsonschema.validate(report, SCHEMA)
    statuses = {f["id"]: f["status"] for f in report["findings"]}
    assert set(statuses.values()) <= {"ok", "skip"}, statuses
    assert all(f["reason"] for f in report["findings"] if f["status"] == "skip")
    # the engine and agent were read: these ran rather than skipped
    for fid in ("kv_cache.fragmentation", "configuration.kv_capacity"):
        assert statuses[fid] == "ok", (fid, report["findings"])
    assert "agent" not in report["inputs"]["missing"] and "engine" not in report["inputs"]["missing"]
    assert "engine_config" not in report["inputs"]["missing"]
