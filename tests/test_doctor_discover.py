"""`inferd doctor` with no endpoint flags finds the local stack: the running stack's state
(`.out/stack/state.json`, or --run-dir), else the default ports; it says where each
endpoint came from. Quick tests use stand-in servers; the slow one starts a real agent
running a real engine, and a real Prometheus, recorded in a stack state as `inferd stack
up` records them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from doctor_nodes import FakeHttp, agent_server, engine_server
from test_agent import REPO, Agent, free_port, get, wait_for

from inferd.agent import stack
from inferd.agent.doctor import discover
from inferd.agent.doctor.schema import SCHEMA

NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing answers


def stand_ins() -> tuple[FakeHttp, FakeHttp, FakeHttp]:
    agent, engine = agent_server(), engine_server()
    agent.routes["/healthz"] = (200, "application/json", "{}")
    prometheus = FakeHttp({"/-/ready": (200, "text/plain", "Prometheus Server is Ready.")})
    return agent, engine, prometheus


def sleeper(run_dir: Path) -> subprocess.Popen:
    """A live process of the stack in `run_dir` (a stand-in for its agent)."""
    return subprocess.Popen(["sleep", "300"], env={**os.environ, stack.MARKER: str(run_dir)})


def doctor_json(*args: str, env: dict | None = None) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "inferd.agent.cli", "doctor", "--json", "--gpu-backend", "replay:/nonexistent", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode in (0, 1, 2) and result.stdout, result.stderr
    report = json.loads(result.stdout)
    jsonschema.validate(report, SCHEMA)
    return report


def test_the_default_ports_are_probed_when_no_stack_runs(tmp_path, monkeypatch):
    agent, engine, prometheus = stand_ins()
    with agent, engine:
        monkeypatch.setattr(
            discover, "DEFAULTS", {"agent": agent.url, "engine": engine.url, "prometheus": prometheus.url}
        )  # the stand-ins listen where the stack would; Prometheus is not started: nothing answers there
        found = discover.find({}, tmp_path / "no-stack", timeout_s=2)
    assert found.urls == {"agent": agent.url, "engine": engine.url, "prometheus": None}
    assert found.where["agent"] == f"the default port: {agent.url} answered"
    assert found.where["prometheus"] == (
        f"no prometheus found: no --prometheus, no running stack in {tmp_path / 'no-stack'}, "
        f"nothing answered at {prometheus.url}"
    )
    assert found.admin_token_file is None


def test_a_flag_wins_and_the_engine_must_answer_like_one(tmp_path, monkeypatch):
    agent, _, _ = stand_ins()
    with agent:
        # the agent answers on the engine's port too, but has no /v1/models: not taken for the engine
        monkeypatch.setattr(discover, "DEFAULTS", {"agent": agent.url, "engine": agent.url, "prometheus": NOWHERE})
        found = discover.find({"agent": "http://10.0.0.1:10400"}, tmp_path, timeout_s=2)
    assert found.urls["agent"] == "http://10.0.0.1:10400" and found.where["agent"] == "--agent"
    assert found.urls["engine"] is None


def test_the_running_stacks_state_wins_over_the_default_ports_and_a_stopped_one_is_ignored(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    agent, engine, prometheus = stand_ins()
    process = sleeper(run_dir)
    try:
        with agent, engine, prometheus:
            defaults = {"agent": NOWHERE, "engine": NOWHERE, "prometheus": prometheus.url}
            monkeypatch.setattr(discover, "DEFAULTS", defaults)
            stack.write_state(
                run_dir,
                {
                    "components": {"agent": {"pid": process.pid, "pgid": process.pid, "url": f"{agent.url}/metrics"}},
                    "endpoints": {"agent": agent.url, "engine": engine.url},
                },
            )
            stack.ensure_token(stack.admin_token_path(run_dir), "the engine's admin token", "")
            found = discover.find({}, run_dir, timeout_s=2)
            assert found.urls == {"agent": agent.url, "engine": engine.url, "prometheus": prometheus.url}
            assert found.where["engine"] == f"the running stack's {run_dir / 'state.json'}"
            assert found.where["prometheus"] == f"the default port: {prometheus.url} answered"
            assert found.admin_token_file == str(stack.admin_token_path(run_dir))
            # a state written before the endpoints were recorded: the agent from its component URL
            stack.write_state(run_dir, {"components": {"agent": {"pid": process.pid, "url": f"{agent.url}/metrics"}}})
            assert discover.find({}, run_dir, timeout_s=2).urls["agent"] == agent.url
            process.kill()
            process.wait()
            found = discover.find({}, run_dir, timeout_s=2)  # the stack stopped; its state stayed behind
            assert found.urls["agent"] is None
            assert f"no running stack in {run_dir}" in found.where["agent"]
    finally:
        process.kill()
        process.wait()


def test_doctor_without_flags_reads_the_stack_and_says_where_it_found_each_endpoint(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    agent, engine, prometheus = stand_ins()
    process = sleeper(run_dir)
    try:
        with agent, engine, prometheus:
            endpoints = {"agent": agent.url, "engine": engine.url, "prometheus": prometheus.url}
            stack.write_state(
                run_dir, {"components": {"agent": {"pid": process.pid, "url": agent.url}}, "endpoints": endpoints}
            )
            report = doctor_json("--run-dir", str(run_dir))
            text = subprocess.run(
                [sys.executable, "-m", "inferd.agent.cli", "doctor", "--run-dir", str(run_dir)],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout
            bare = doctor_json("--run-dir", str(run_dir), "--no-discover")
    finally:
        process.kill()
        process.wait()
    where = f"the running stack's {run_dir / 'state.json'}"
    assert {n: report["inputs"][n] for n in endpoints} == endpoints
    assert report["inputs"]["found"] == {n: where for n in endpoints}
    assert not {"agent", "engine", "prometheus"} & set(report["inputs"]["missing"])
    assert text.splitlines()[:3] == [f"{n:<11} {url}  ({where})" for n, url in endpoints.items()]
    assert text.splitlines()[3] == "" and text.splitlines()[4].startswith("STATUS")
    assert {n: bare["inputs"][n] for n in endpoints} == dict.fromkeys(endpoints)
    assert bare["inputs"]["found"] == {}


# --- live: a real agent running a real engine, and a real Prometheus --------------------


def start_prometheus(tmp_path: Path, agent_url: str) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not installed (Debian package prometheus)")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    target = agent_url.removeprefix("http://")
    config.write_text(
        f"scrape_configs:\n  - job_name: inferd-agent\n    static_configs:\n      - targets: ['{target}']\n"
    )
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return process, f"http://127.0.0.1:{port}"


@pytest.mark.slow
def test_doctor_finds_a_real_agent_engine_and_prometheus_from_the_stacks_state(tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    token = stack.admin_token_path(run_dir)
    stack.ensure_token(token, "the engine's admin token", "")  # as `inferd stack up` makes it
    engine_port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "INFERD_ADMIN_TOKEN"}
    agent = Agent(
        "--model",
        tiny_model,
        "--engine-port",
        str(engine_port),
        "--admin-token-file",
        str(token),
        "--no-collector",
        "gpu",
    )
    engine_url = f"http://127.0.0.1:{engine_port}"
    prometheus, prometheus_url = start_prometheus(tmp_path, agent.url)

    def ready(url: str) -> bool:
        try:
            return get(url, timeout=2)[0] == 200
        except OSError:
            return False

    try:
        agent.wait_ready()
        assert wait_for(lambda: ready(f"{engine_url}/ready"), timeout=180), "inferd serve did not come up"
        assert wait_for(lambda: ready(f"{prometheus_url}/-/ready"), timeout=60), "prometheus did not come up"
        endpoints = {"agent": agent.url, "engine": engine_url, "prometheus": prometheus_url}
        stack.write_state(
            run_dir,
            {
                "components": {
                    "agent": {"pid": agent.process.pid, "pgid": agent.process.pid, "url": f"{agent.url}/metrics"},
                    "prometheus": {"pid": prometheus.pid, "pgid": prometheus.pid, "url": prometheus_url},
                },
                "endpoints": endpoints,
            },
        )
        report = doctor_json("--run-dir", str(run_dir), env=env)
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
        assert agent.stop() == 0
    assert {n: report["inputs"][n] for n in endpoints} == endpoints
    assert set(report["inputs"]["found"].values()) == {f"the running stack's {run_dir / 'state.json'}"}
    missing = report["inputs"]["missing"]
    assert not {"agent", "engine", "engine_config", "engine_model", "prometheus"} & set(missing), missing
    statuses = {f["id"]: f["status"] for f in report["findings"]}
    assert statuses["configuration.kv_capacity"] == "ok"  # read the engine's /admin/config with the stack's token
