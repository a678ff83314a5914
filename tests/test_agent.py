"""`inferd agent` as users run it: a real process, real HTTP, fixture hosts, a supervised engine."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from inferd.agent.placement import best_node_for_gpus
from inferd.agent.topology import discover

from fixture_trees import promtool_check_metrics, write_host

REPO = Path(__file__).resolve().parent.parent
EIGHT_GPUS = Path(__file__).parent / "fixtures" / "gpu" / "eight_h200.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_for(predicate, timeout: float = 60.0, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return None


class Agent:
    def __init__(self, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "inferd.agent.cli",
                "agent",
                "--port",
                str(self.port),
                "--no-collector",
                "ebpf",
                *args,
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_ready(self) -> None:
        def ready():
            if self.process.poll() is not None:
                raise AssertionError(f"agent exited {self.process.returncode}: {self.process.stderr.read()}")
            try:
                return get(f"{self.url}/healthz", timeout=2)[0] in (200, 503)
            except OSError:
                return False

        assert wait_for(ready), "agent did not answer /healthz"

    def health(self) -> dict:
        return json.loads(get(f"{self.url}/healthz")[1])

    def metrics(self) -> str:
        return get(f"{self.url}/metrics")[1]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=60)


@pytest.fixture
def fixture_host(tmp_path):
    return write_host(tmp_path / "host")


def test_agent_scrape_passes_promtool_and_serves_topology(fixture_host):
    agent = Agent(
        "--no-engine",
        "--gpu-backend",
        f"replay:{EIGHT_GPUS}",
        "--sysfs-root",
        str(fixture_host.sysfs),
        "--procfs-root",
        str(fixture_host.procfs),
    )
    try:
        agent.wait_ready()
        text = agent.metrics()
        status, body = get(f"{agent.url}/v1/topology")
        health = agent.health()
    finally:
        assert agent.stop() == 0
    problems = promtool_check_metrics(text)
    assert [line for line in problems.splitlines() if line.startswith("inferd_")] == []
    for collector in ("gpu", "pcie", "numa", "engine"):
        assert f'inferd_collector_up{{collector="{collector}"}} 1.0' in text
    assert text.count("DCGM_FI_PROF_SM_ACTIVE{") == 8
    assert "inferd_engine_up" not in text  # no engine supervised: no series, not a 0 that reads as "down"

    topology = discover(fixture_host.sysfs)
    assert status == 200
    served = json.loads(body)
    assert served["topology"] == json.loads(topology.to_json())
    assert served["placement"]["node"] == best_node_for_gpus(topology)
    assert health["status"] == "ok" and health["engine"] is None


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda tmp: tmp / "missing", "does not exist"),
        (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", "has no config.json"),
    ],
)
def test_bad_model_path_is_a_clear_error_not_a_restart_loop(tmp_path, make, message):
    model = make(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "inferd.agent.cli", "agent", "--model", str(model), "--port", str(free_port())],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert f"inferd agent: --model: {model} {message}" in result.stderr


def test_engine_dying_at_startup_with_the_same_error_leaves_the_agent_serving():
    crash = f"{sys.executable} -c \"import sys; sys.exit('error: cannot load weights')\""
    agent = Agent("--engine-command", crash, "--gpu-backend", f"replay:{EIGHT_GPUS}")
    try:
        agent.wait_ready()
        health = wait_for(lambda: (h := agent.health())["engine"]["crash_loop"] and h, timeout=60)
        assert health, "the agent did not report the crash loop"
        assert health["status"] == "degraded"
        assert (
            "engine exited during start-up 3 times in a row with: error: cannot load weights"
            in health["engine"]["error"]
        )
        assert "inferd_engine_up 0.0" in agent.metrics()
        assert agent.process.poll() is None  # still serving /metrics and the webhook
    finally:
        assert agent.stop() == 0


def test_killed_engine_is_restarted_and_stopping_the_agent_stops_the_engine():
    sleeper = f'{sys.executable} -c "import time; time.sleep(600)"'
    agent = Agent("--engine-command", sleeper, "--gpu-backend", f"replay:{EIGHT_GPUS}")
    try:
        agent.wait_ready()
        first = wait_for(lambda: agent.health()["engine"]["pid"])
        assert "inferd_engine_up 1.0" in agent.metrics()
        time.sleep(0.2)
        os.kill(first, signal.SIGKILL)
        second = wait_for(lambda: (pid := agent.health()["engine"]["pid"]) not in (None, first) and pid)
        assert second
        text = agent.metrics()
        assert "inferd_engine_restarts_total 1.0" in text and "inferd_engine_up 1.0" in text
    finally:
        assert agent.stop() == 0
    with pytest.raises(ProcessLookupError):
        os.kill(second, 0)


def test_sigint_stops_agent_and_engine():
    agent = Agent(
        "--engine-command",
        f'{sys.executable} -c "import time; time.sleep(600)"',
        "--gpu-backend",
        f"replay:{EIGHT_GPUS}",
    )
    try:
        agent.wait_ready()
        engine = wait_for(lambda: agent.health()["engine"]["pid"])
    finally:
        assert agent.stop(signal.SIGINT) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(engine, 0)


@pytest.mark.slow
def test_real_engine_is_supervised(tiny_model):
    engine_port = free_port()
    agent = Agent("--model", tiny_model, "--engine-port", str(engine_port), "--gpu-backend", f"replay:{EIGHT_GPUS}")
    engine_health = f"http://127.0.0.1:{engine_port}/ready"

    def engine_answers():
        try:
            return get(engine_health, timeout=2)[0] == 200
        except OSError:
            return False

    try:
        agent.wait_ready()
        assert wait_for(engine_answers, timeout=180), "inferd serve did not come up"
        first = agent.health()["engine"]["pid"]
        os.kill(first, signal.SIGKILL)
        assert wait_for(lambda: agent.health()["engine"]["pid"] not in (None, first), timeout=30)
        assert wait_for(engine_answers, timeout=180), "restarted inferd serve did not come up"
        second = agent.health()["engine"]["pid"]
        assert "inferd_engine_restarts_total 1.0" in agent.metrics()
    finally:
        assert agent.stop() == 0
    with pytest.raises(ProcessLookupError):
        os.kill(second, 0)


@pytest.mark.slow
def test_three_quick_kills_of_a_ready_engine_leave_the_agent_serving_and_remediation_in_force(tiny_model, tmp_path):
    """The agent outlives an engine killed three times in a row as soon as it is ready, and
    a fresh engine gets back the change the remediation policy had made."""
    from remediation_fakes import alert_payload

    engine_port = free_port()
    (tmp_path / "webhook.token").write_text("hook-secret")
    (tmp_path / "admin.token").write_text("admin-secret")
    agent = Agent(
        "--model",
        tiny_model,
        "--engine-port",
        str(engine_port),
        "--gpu-backend",
        f"replay:{EIGHT_GPUS}",
        "--webhook-token-file",
        str(tmp_path / "webhook.token"),
        "--admin-token-file",
        str(tmp_path / "admin.token"),
        "--audit-log",
        str(tmp_path / "audit.jsonl"),
        "--prometheus-url",
        f"http://127.0.0.1:{free_port()}",
    )
    engine_url = f"http://127.0.0.1:{engine_port}"

    def engine_ready():
        try:
            return get(f"{engine_url}/ready", timeout=2)[0] == 200
        except OSError:
            return False

    def engine_config():
        request = urllib.request.Request(f"{engine_url}/admin/config", headers={"Authorization": "Bearer admin-secret"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())["config"]

    def post_alert():
        request = urllib.request.Request(
            f"{agent.url}/v1/alerts",
            data=json.dumps(alert_payload()).encode(),
            headers={"Authorization": "Bearer hook-secret", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())["results"][0]

    try:
        agent.wait_ready()
        assert wait_for(engine_ready, timeout=180), "inferd serve did not come up"
        assert post_alert()["result"] == "applied"
        assert engine_config()["max_num_seqs"] == 48
        for _ in range(3):
            pid = agent.health()["engine"]["pid"]
            os.kill(pid, signal.SIGKILL)
            assert wait_for(lambda pid=pid: agent.health()["engine"]["pid"] not in (None, pid), timeout=30)
            assert wait_for(engine_ready, timeout=180), "restarted inferd serve did not come up"
            assert get(f"{agent.url}/metrics")[0] == 200
        assert agent.process.poll() is None and not agent.health()["engine"]["crash_loop"]
        assert wait_for(lambda: engine_config()["max_num_seqs"] == 48, timeout=30), "the change was not re-applied"

        def reapplied():
            records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
            return [r["new"] for r in records if r["event"] == "reapplied"]

        assert wait_for(reapplied, timeout=10), "no reapplied record"
        assert reapplied()[-1] == {"max_num_seqs": 48}
        assert "inferd_engine_restarts_total 3.0" in agent.metrics()
    finally:
        assert agent.stop() == 0


def test_fast_renderer_writes_exactly_what_generate_latest_writes(fixture_host):
    from prometheus_client import CollectorRegistry, Counter, Enum, Histogram, Info, Summary, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    from inferd.exporters.exposition import render_exposition
    from inferd.exporters.gpu import GpuCollector
    from inferd.exporters.gpu_replay import ReplayBackend
    from inferd.exporters.numa import NumaCollector
    from inferd.exporters.pcie import PcieCollector

    families = [
        f
        for c in (
            GpuCollector(ReplayBackend(EIGHT_GPUS)),
            PcieCollector(fixture_host.sysfs),
            NumaCollector(fixture_host.sysfs, fixture_host.procfs),
        )
        for f in c.collect()
    ]
    registry = CollectorRegistry()
    Counter("odd", "help with \\ and\nnewline", ["a"], registry=registry).labels('v"\\\n').inc()
    Histogram("latency_seconds", "doc", registry=registry).observe(0.3)
    Summary("size_bytes", "doc", registry=registry).observe(2)
    Info("build", "doc", registry=registry).info({"version": "1"})
    Enum("state", "doc", states=["a", "b"], registry=registry)
    utf8 = GaugeMetricFamily("dotted.name", "needs UTF-8 escaping", labels=["x"])
    utf8.add_metric(["1"], 1e21)
    families += [*registry.collect(), utf8]

    class Fixed:
        def collect(self):
            return families

    reference = CollectorRegistry()
    reference.register(Fixed())
    assert render_exposition(families) == generate_latest(reference)


def test_registry_lists_every_collector_once_with_a_description():
    from inferd.agent.collectors import COLLECTOR_MODULES
    from inferd.exporters.registry import load_entries

    entries = load_entries(COLLECTOR_MODULES)
    assert [e.name for e in entries] == ["gpu", "pcie", "numa", "ebpf", "engine", "headroom", "otlp", "remediation"]
    assert all(e.description and e.default_on for e in entries)
    assert [e.name for e in entries if e.late] == ["remediation"]


def test_enabled_names_default_on_enable_and_disable():
    import argparse

    from inferd.exporters.registry import Built, CollectorEntry, add_collector_arguments, enabled_names

    build = lambda context: None  # noqa: E731
    entries = [CollectorEntry("a", "on", build), CollectorEntry("b", "off", build, default_on=False)]
    assert enabled_names(entries) == {"a"}
    assert enabled_names(entries, enable=["b"]) == {"a", "b"}
    assert enabled_names(entries, enable=["b"], disable=["a", "b"]) == set()
    with pytest.raises(ValueError, match="unknown collector.*c; known: a, b"):
        enabled_names(entries, disable=["c"])
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_collector_arguments(parser, entries)
    assert parser.parse_args(["--collector", "b", "--no-collector", "a"]).no_collector == ["a"]
    with pytest.raises(argparse.ArgumentError, match="invalid choice: 'c'"):
        parser.parse_args(["--no-collector", "c"])
    with pytest.raises(ValueError, match="snake_case"):
        CollectorEntry("Bad-Name", "x", build)
    assert Built(object()).start is None


def test_build_entries_in_phases_and_a_disabled_name_is_never_added(tmp_path):
    import argparse

    from inferd.exporters.registry import BuildContext, Built, CollectorEntry, CollectorSet, build_entries

    class Named:
        def __init__(self, name):
            self.name = name

        def collect(self):
            return []

    entries = [
        CollectorEntry(n, n, lambda context, n=n: Built(Named(n)), late=n == "late")
        for n in ("early", "none", "off", "late")
    ]
    entries[1] = CollectorEntry("none", "builds nothing", lambda context: None)
    collectors = CollectorSet(disabled={"off"})
    context = BuildContext(argparse.Namespace(), frozenset({"early", "none", "late"}), collectors)
    assert [b.collector.name for b in build_entries(entries, context)] == ["early"]
    collectors.add(Named("off"))  # a module adding a disabled collector itself
    assert [b.collector.name for b in build_entries(entries, context, late=True)] == ["late"]
    assert collectors.names == ["early", "late"]


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc/PID/stat parent ids."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


@pytest.mark.slow
def test_sigkilled_agent_takes_its_engine_and_engine_core_with_it(tiny_model):
    from inferd.agent.engine_port import is_running

    engine_port = free_port()
    agent = Agent("--model", tiny_model, "--engine-port", str(engine_port), "--gpu-backend", f"replay:{EIGHT_GPUS}")

    def engine_answers():
        try:
            return get(f"http://127.0.0.1:{engine_port}/ready", timeout=2)[0] == 200
        except OSError:
            return False

    try:
        agent.wait_ready()
        assert wait_for(engine_answers, timeout=180), "inferd serve did not come up"
        engine = agent.health()["engine"]["pid"]
        below = descendants(engine)
        assert below, "the engine core process was not found"
    finally:
        agent.stop(signal.SIGKILL)
    processes = [engine, *below]
    assert wait_for(lambda: not any(is_running(pid) for pid in processes), timeout=60), [
        pid for pid in processes if is_running(pid)
    ]


def test_agent_leaves_an_engine_port_held_by_another_process_alone_and_says_so(tiny_model):
    engine_port = free_port()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1])));"
            " s.listen(); print('listening', flush=True); time.sleep(600)",
            str(engine_port),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    agent = None
    try:
        assert holder.stdout.readline().strip() == "listening"
        agent = Agent("--model", tiny_model, "--engine-port", str(engine_port), "--gpu-backend", f"replay:{EIGHT_GPUS}")
        agent.wait_ready()
        health = wait_for(lambda: (h := agent.health())["engine"]["error"] and h, timeout=30)
        assert health, "the agent did not say who holds the engine port"
        assert f"engine port 127.0.0.1:{engine_port} is held by pid {holder.pid}" in health["engine"]["error"]
        assert health["status"] == "degraded" and health["engine"]["pid"] is None
        assert health["engine"]["restarts"] == 0 and health["engine"]["orphan_stopped"] is None
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait()
        if agent is not None:
            assert agent.stop() == 0


@pytest.mark.parametrize("engine_args", [["--load-format=dummy"], ["--load-format", "dummy"]])
def test_a_weightless_checkpoint_is_a_model_with_load_format_dummy(tmp_path, engine_args):
    from inferd.agent.main import engine_load_format, model_dir_problem

    (tmp_path / "config.json").write_text("{}")
    assert model_dir_problem(tmp_path, engine_load_format(engine_args)) is None
    assert (
        model_dir_problem(tmp_path, engine_load_format(["--max-num-seqs", "8"]))
        == f"{tmp_path} has no *.safetensors weights"
    )
