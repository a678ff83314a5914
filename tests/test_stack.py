"""`inferd stack up|down`: the stack without Docker.

Quick tests drive the process handling with stand-in processes; the live test starts the
real thing (Prometheus, Alertmanager, agent with the engine) and checks every URL
answered while up and that nothing is left behind after down.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from inferd.agent import stack

ROOT = Path(__file__).resolve().parents[1]


def cli(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "inferd.agent.cli", "stack", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def spawn_marked(run_dir: Path, script: str) -> subprocess.Popen:
    env = {**os.environ, stack.MARKER: str(run_dir)}
    return subprocess.Popen(["sh", "-c", script], env=env, start_new_session=True)


def test_components_use_the_files_compose_mounts(tmp_path):
    if not (shutil.which("prometheus") and shutil.which("prometheus-alertmanager")):
        pytest.skip("prometheus / prometheus-alertmanager not installed (Debian packages)")
    config = stack.StackConfig(run_dir=tmp_path, agent_args=("--gpu-backend=replay:x.json",))
    wanted, notes = stack.components(config)
    by_name = {c.name: c for c in wanted}
    assert list(by_name)[:3] == ["agent", "prometheus", "alertmanager"]
    assert f"--config.file={ROOT / 'prometheus/prometheus.yml'}" in by_name["prometheus"].argv
    assert f"--config.file={ROOT / 'alerts/alertmanager.yml'}" in by_name["alertmanager"].argv
    assert by_name["agent"].argv[-1] == "--gpu-backend=replay:x.json"
    assert str(stack.token_file()) in by_name["agent"].argv
    for component in wanted:
        for arg in component.argv:
            if "-data" in arg:
                assert str(tmp_path) in arg, "data must live in the run directory"
    if shutil.which("grafana") or shutil.which("grafana-server"):
        assert "grafana" in by_name
    else:
        assert any(n.startswith("grafana") and "not started: not installed" in n for n in notes)
    assert any(n.startswith("otel-collector") and "not started" in n for n in notes)
    assert "--no-engine" in by_name["agent"].argv  # no model given
    assert any(n.startswith("engine") and "--no-engine" in n for n in notes)


def test_a_user_who_may_not_write_etc_gets_the_webhook_token_in_the_run_directory(tmp_path, monkeypatch):
    if not (shutil.which("prometheus") and shutil.which("prometheus-alertmanager")):
        pytest.skip("prometheus / prometheus-alertmanager not installed (Debian packages)")
    monkeypatch.setattr(stack.tokens, "_usable", lambda path: False)  # as for a user who cannot create /etc/inferd
    wanted, _ = stack.components(stack.StackConfig(run_dir=tmp_path))
    by_name = {c.name: c for c in wanted}
    assert f"--config.file={tmp_path / 'alertmanager.yml'}" in by_name["alertmanager"].argv
    assert str(tmp_path / "webhook-token") in by_name["agent"].argv
    config = (tmp_path / "alertmanager.yml").read_text()
    assert f"credentials_file: {tmp_path / 'webhook-token'}" in config and "/etc/inferd" not in config
    amtool = shutil.which("amtool")
    if amtool:
        result = subprocess.run(
            [amtool, "check-config", str(tmp_path / "alertmanager.yml")], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_engine_gets_the_admin_token_from_the_run_directory(tmp_path, capsys):
    if not (shutil.which("prometheus") and shutil.which("prometheus-alertmanager")):
        pytest.skip("prometheus / prometheus-alertmanager not installed (Debian packages)")
    config = stack.StackConfig(run_dir=tmp_path, model=Path("/models/m"))
    agent = {c.name: c for c in stack.components(config)[0]}["agent"]
    path = stack.admin_token_path(tmp_path)
    assert agent.argv[agent.argv.index("--admin-token-file") + 1] == str(path)
    assert stack.token(config) == 1  # not made yet
    assert "stack up" in capsys.readouterr().err
    stack.ensure_token(path, "the engine's admin token", "")
    assert path.stat().st_mode & 0o777 == 0o600
    first = path.read_text()
    stack.ensure_token(path)  # kept across restarts
    assert path.read_text() == first and len(first) == 64
    assert stack.token(config) == 0
    assert capsys.readouterr().out.strip() == first


def test_stop_hint_is_a_command_that_works_from_here(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # inferd not on PATH
    monkeypatch.chdir(stack.REPO)
    hint = stack.stop_hint(stack.DEFAULT_RUN_DIR)
    assert hint.startswith("`make stop`")
    assert "`inferd stack down`" not in hint
    command = stack.inferd_command()
    assert command != "inferd"
    assert f"`{command} stack down`" in hint
    monkeypatch.chdir(tmp_path)
    command = stack.inferd_command()
    assert Path(command.split()[0]).is_absolute()
    assert "make stop" not in stack.stop_hint(stack.DEFAULT_RUN_DIR)
    assert stack.stop_hint(tmp_path / "run") == f"`{command} stack down --run-dir {tmp_path / 'run'}`"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "inferd").write_text("#!/bin/sh\n")
    (bin_dir / "inferd").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert stack.inferd_command() == "inferd"


def test_down_stops_a_process_tree_including_one_that_left_its_group(tmp_path):
    # A parent in its own group, and a grandchild that escaped it with setsid (as a
    # supervised child that starts its own session would).
    parent = spawn_marked(tmp_path, "setsid sleep 300 & sleep 300")
    deadline = time.monotonic() + 5
    while len(stack.marked_pids(tmp_path)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    before = stack.marked_pids(tmp_path)
    assert parent.pid in before and len(before) >= 2
    stack.write_state(tmp_path, {"components": {"agent": {"pid": parent.pid, "pgid": parent.pid, "url": "-"}}})
    assert stack.down(stack.StackConfig(run_dir=tmp_path, timeout_s=5)) == 0
    parent.wait(timeout=5)
    assert stack.marked_pids(tmp_path) == []
    assert not any(stack.is_running(p) for p in before)
    assert not (tmp_path / stack.STATE_FILE).exists()


def test_down_with_nothing_running_and_status(tmp_path, capsys):
    config = stack.StackConfig(run_dir=tmp_path, timeout_s=1)
    assert stack.down(config) == 0
    assert "nothing running" in capsys.readouterr().out
    assert stack.status(config) == 1


def test_up_refuses_when_this_run_dir_is_already_running(tmp_path, capsys):
    sleeper = spawn_marked(tmp_path, "sleep 300")
    try:
        deadline = time.monotonic() + 5
        while not stack.marked_pids(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stack.up(stack.StackConfig(run_dir=tmp_path, timeout_s=5)) == 1
        assert "already running" in capsys.readouterr().err
    finally:
        sleeper.kill()
        sleeper.wait()


def engine_stand_in(model: str = "tiny"):
    from doctor_nodes import FakeHttp

    models = {"object": "list", "data": [{"id": model, "object": "model"}]}
    return FakeHttp({"/ready": (200, "text/plain", "ok"), "/v1/models": (200, "application/json", json.dumps(models))})


def test_startup_summary_names_the_model_clients_send_not_the_checkpoint_path(tmp_path):
    checkpoint = tmp_path / "models" / "tiny-checkpoint"
    with engine_stand_in("tiny") as engine:
        name = stack.served_model(engine.url)
        line = stack.engine_summary(engine.url, name, checkpoint)
    assert name == "tiny"
    assert line.split()[:2] == ["engine", f"{engine.url}/v1"]
    assert 'send "model": "tiny"' in line
    assert line.index(str(checkpoint)) > line.index("checkpoint")  # the path only as the checkpoint
    assert stack.served_model("http://127.0.0.1:9") is None  # nothing there


def test_status_lists_the_engine_the_agent_runs(tmp_path, capsys):
    agent = spawn_marked(tmp_path, "sleep 300")  # the agent: a process of this stack
    try:
        with engine_stand_in("tiny") as engine:
            state = {
                "components": {"agent": {"pid": agent.pid, "pgid": agent.pid, "url": "http://localhost:10400/metrics"}},
                "endpoints": {"agent": "http://localhost:10400", "engine": engine.url},
                "model": "tiny",
            }
            stack.write_state(tmp_path, state)
            assert stack.status(stack.StackConfig(run_dir=tmp_path)) == 0
            lines = capsys.readouterr().out.splitlines()
        assert [line.split()[0] for line in lines] == ["agent", "engine"]
        engine_line = lines[1].split()
        assert engine_line[1] == "up" and f"{engine.url}/v1" in engine_line
        assert lines[1].endswith('(send "model": "tiny")')
        # the engine stopped: DOWN, and status says the stack is not healthy
        assert stack.status(stack.StackConfig(run_dir=tmp_path)) == 1
        assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["engine", "DOWN"]
    finally:
        agent.kill()
        agent.wait()


def test_config_validation():
    with pytest.raises(ValueError, match="timeout"):
        stack.StackConfig(run_dir=Path("/tmp/x"), timeout_s=0)


# --- live ------------------------------------------------------------------------------

PORTS = (8000, 9090, 9093, 10400)


def live_preconditions() -> None:
    for binary in ("prometheus", "prometheus-alertmanager"):
        if shutil.which(binary) is None:
            pytest.skip(f"{binary} not installed (Debian package)")
    for module in ("agent/main.py", "engine/server"):
        if not (ROOT / module).exists():
            pytest.skip(f"{module} has not landed yet: `inferd agent` / `inferd serve` missing")
    busy = [p for p in PORTS if stack.port_in_use(p)]
    if busy:
        pytest.skip(f"ports in use by something else: {busy}")


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read()


@pytest.mark.slow
@pytest.mark.usefixtures("live_ports")  # 8000/9090/9093/10400: one live stack at a time, across xdist workers
def test_stack_up_answers_every_url_and_down_leaves_nothing(tmp_path):
    live_preconditions()
    run_dir = tmp_path / "run"
    started = cli(
        "up",
        "--run-dir",
        str(run_dir),
        "--timeout",
        "240",
        f"--agent-arg=--audit-log={tmp_path / 'audit.jsonl'}",
        timeout=300,
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        state = json.loads((run_dir / stack.STATE_FILE).read_text())
        pids = {e["pid"] for e in state["components"].values()} | set(stack.marked_pids(run_dir))
        urls = [
            line.split()[1]
            for line in started.stdout.splitlines()
            if line.split()[1:2] and line.split()[1].startswith("http")
        ]
        assert len(urls) >= 4, started.stdout
        for url in urls:
            if url.endswith("/v1"):
                url += "/models"
            status, _ = get(url)
            assert status == 200, url
        # Prometheus scrapes both targets with the repository's config
        deadline = time.monotonic() + 60
        up = {}
        while time.monotonic() < deadline and up != {"inferd-agent": "1", "inferd-engine": "1"}:
            _, body = get("http://localhost:9090/api/v1/query?query=up%7Bjob%3D~%22inferd-.*%22%7D")
            up = {r["metric"]["job"]: r["value"][1] for r in json.loads(body)["data"]["result"]}
            time.sleep(1)
        assert up == {"inferd-agent": "1", "inferd-engine": "1"}
        _, rules = get("http://localhost:9090/api/v1/rules")
        assert json.loads(rules)["data"]["groups"], "the repository's alert rules are loaded"
        # the engine's admin API answers the token `up` wrote and printed
        token_path = stack.admin_token_path(run_dir)
        assert str(token_path) in started.stdout and token_path.stat().st_mode & 0o777 == 0o600
        request = urllib.request.Request(
            "http://localhost:8000/admin/config", headers={"Authorization": f"Bearer {token_path.read_text().strip()}"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert "max_num_seqs" in json.loads(response.read())["config"]
        assert "not started" in started.stdout and "stack down" in started.stdout
        # the summary names the model clients send, and status lists the engine the agent runs
        assert 'send "model": "tiny"' in started.stdout, started.stdout
        status = cli("status", "--run-dir", str(run_dir), timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        engine_line = next(line for line in status.stdout.splitlines() if line.startswith("engine"))
        assert engine_line.split()[1] == "up" and "http://localhost:8000/v1" in engine_line
        # `inferd doctor` with no endpoint flag reads this stack: from its state, and from the default ports
        endpoints = {"agent": stack.AGENT_URL, "engine": stack.ENGINE_URL, "prometheus": stack.PROMETHEUS_URL}
        for args, where in (
            (("--run-dir", str(run_dir)), f"the running stack's {run_dir / stack.STATE_FILE}"),
            ((), None),
        ):
            doctor = subprocess.run(
                [sys.executable, "-m", "inferd.agent.cli", "doctor", "--json", *args],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            report = json.loads(doctor.stdout)
            assert {n: report["inputs"][n] for n in endpoints} == endpoints, doctor.stderr
            for name, url in endpoints.items():
                assert report["inputs"]["found"][name] == (where or f"the default port: {url} answered")
            if where:  # the engine's admin config read with the admin token in the stack's run directory
                assert "engine_config" not in report["inputs"]["missing"], report["inputs"]["missing"]
        _, am = get("http://localhost:9093/api/v2/status")
        assert json.loads(am)["config"]["original"].count("inferd-agent") >= 1
        # `inferd report` against the real Prometheus: the engine's gauges are always there
        out = tmp_path / "report"
        report = subprocess.run(
            [sys.executable, "-m", "inferd.agent.cli", "report", "--minutes", "2", "--step", "5", "--out", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert report.returncode == 0, report.stderr
        assert (out / "inferd-engine-requests-running-and-waiting.png").read_bytes()[:4] == b"\x89PNG"
        assert "Requests running and waiting" in (out / "index.html").read_text()
    finally:
        stopped = cli("down", "--run-dir", str(run_dir), "--timeout", "30", timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert stack.marked_pids(run_dir) == []
    assert not [p for p in pids if stack.is_running(p)]
    assert not [p for p in PORTS if stack.port_in_use(p)]


def test_grafana_is_started_with_the_repository_provisioning_where_installed(tmp_path, monkeypatch):
    if not (shutil.which("prometheus") and shutil.which("prometheus-alertmanager")):
        pytest.skip("prometheus / prometheus-alertmanager not installed (Debian packages)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "grafana"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    wanted, notes = stack.components(stack.StackConfig(run_dir=tmp_path / "run"))
    grafana = {c.name: c for c in wanted}["grafana"]
    assert grafana.argv[:2] == (str(fake), "server")
    env = dict(grafana.env)
    assert env["GF_PATHS_PROVISIONING"] == str(ROOT / "dashboards" / "provisioning")
    assert env["INFERD_DASHBOARDS_DIR"] == str(ROOT / "dashboards" / "generated")
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert env["GF_PATHS_DATA"].startswith(str(tmp_path / "run"))
    assert grafana.health_url == "http://localhost:3000/api/health"
    assert not [n for n in notes if n.startswith("grafana")]
    without, notes = stack.components(stack.StackConfig(run_dir=tmp_path / "run", with_grafana=False))
    assert "grafana" not in {c.name for c in without}
    assert any(n.startswith("grafana") and "--no-grafana" in n for n in notes)
