"""Engine supervision with small Python children: restart, crash loop, binding, clean stop,
readiness probing against a child that serves /ready."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from inferd.agent.supervisor import EngineCollector, Supervisor, SupervisorConfig, bound_command, launcher_main

from fixture_trees import scrape
from server_fixtures import free_port

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def wait_for(predicate, timeout=10.0, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def fast_config(command, **overrides) -> SupervisorConfig:
    values = dict(backoff_initial_s=0.05, backoff_max_s=0.2, healthy_after_s=1.0, stop_timeout_s=5.0)
    values.update(overrides)
    return SupervisorConfig(command=command, **values)


def test_killed_engine_is_restarted_and_metrics_say_so():
    supervisor = Supervisor(fast_config(SLEEPER, healthy_after_s=0.2))
    supervisor.start()
    try:
        assert wait_for(lambda: supervisor.is_up)
        text = scrape(EngineCollector(supervisor))
        assert "inferd_engine_up 1.0" in text and "inferd_engine_restarts_total 0.0" in text
        first = supervisor.pid
        time.sleep(0.3)  # past healthy_after_s: a crash, not a start-up failure
        os.kill(first, signal.SIGKILL)
        assert wait_for(lambda: supervisor.pid not in (None, first))
        text = scrape(EngineCollector(supervisor))
        assert "inferd_engine_up 1.0" in text and "inferd_engine_restarts_total 1.0" in text
    finally:
        supervisor.stop()
    assert not supervisor.is_up
    assert "inferd_engine_up 0.0" in scrape(EngineCollector(supervisor))


def test_hung_engine_is_restarted_on_request_but_not_while_starting():
    supervisor = Supervisor(fast_config(SLEEPER, healthy_after_s=0.5))
    supervisor.start()
    try:
        assert wait_for(lambda: supervisor.is_up)
        first = supervisor.pid
        assert not supervisor.restart("test: still starting")  # a loading engine does not answer either
        time.sleep(0.6)
        os.kill(first, signal.SIGSTOP)  # hung: alive, answers nothing
        assert supervisor.restart("test: hung")
        assert wait_for(lambda: supervisor.pid not in (None, first))
        assert supervisor.restarts == 1
        assert wait_for(lambda: not _alive(first))
    finally:
        supervisor.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def test_repeated_startup_failure_is_a_crash_loop_that_keeps_retrying_with_a_growing_backoff():
    crash = [sys.executable, "-c", "import sys; sys.exit('error: model directory /nope has no config.json')"]
    supervisor = Supervisor(fast_config(crash, max_startup_failures=3, backoff_max_s=0.1, crash_backoff_max_s=0.4))
    supervisor.start()
    try:
        assert wait_for(lambda: supervisor.crash_looping, timeout=20)
        assert "3 times" in supervisor.error and "has no config.json" in supervisor.error
        restarts = supervisor.restarts
        assert wait_for(lambda: supervisor.restarts >= restarts + 2, timeout=20)  # never gives up
        assert not supervisor.wait(timeout=0.1)  # the loop runs on
        text = scrape(EngineCollector(supervisor))
        assert "inferd_engine_up 0.0" in text
    finally:
        supervisor.stop()


def test_quick_kills_of_a_ready_engine_are_not_start_up_failures(tmp_path):
    """A ready engine killed again and again, each time soon after it started, is
    restarted each time: it was ready, so its death is no start-up failure."""
    engine = FakeEngine(tmp_path, state="ready")
    ready_generations = []
    supervisor = Supervisor(probed_config(engine, max_startup_failures=1, healthy_after_s=30.0))
    supervisor.add_ready_listener(ready_generations.append)
    supervisor.start()
    try:
        for _ in range(3):
            assert wait_for(lambda: supervisor.is_ready)
            pid = supervisor.pid
            os.kill(pid, signal.SIGKILL)
            assert wait_for(lambda pid=pid: supervisor.pid not in (None, pid))
            assert not supervisor.crash_looping
        assert wait_for(lambda: supervisor.is_ready)
        assert wait_for(lambda: ready_generations == [1, 2, 3, 4])  # each new engine once
    finally:
        supervisor.stop()


def test_stop_terminates_the_engine_process_group():
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"
    supervisor = Supervisor(fast_config([sys.executable, "-c", script]))
    supervisor.start()
    assert wait_for(lambda: supervisor.is_up)
    pgid = supervisor.pid
    time.sleep(0.3)  # let the grandchild start
    supervisor.stop()
    assert not supervisor.is_up
    assert wait_for(lambda: not _group_alive(pgid), timeout=5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_child_runs_with_cpu_affinity_and_memory_policy(tmp_path):
    cpus = (min(os.sched_getaffinity(0)),)
    out = tmp_path / "binding.txt"
    probe = (
        "import os, sys; maps = open('/proc/self/numa_maps').read();"
        f"open({str(out)!r}, 'w').write(repr(sorted(os.sched_getaffinity(0))) + '\\n' + ('bind:0' in maps).__repr__());"
        "import time; time.sleep(600)"
    )
    for use_numactl in (False, True):
        config = fast_config([sys.executable, "-c", probe], cpus=cpus, mem_node=0, use_numactl=use_numactl)
        if use_numactl and "numactl" not in bound_command(config)[1]:
            continue  # numactl not installed: the launcher path above covered binding
        supervisor = Supervisor(config)
        supervisor.start()
        try:
            assert wait_for(lambda: out.exists() and out.read_text().count("\n") == 1)
            affinity, bound = out.read_text().splitlines()
            assert affinity == repr(list(cpus))
            assert bound == "True", "memory policy MPOL_BIND to node 0 not visible in numa_maps"
        finally:
            supervisor.stop()
            out.unlink(missing_ok=True)


def test_bound_command_without_binding_is_the_plain_command():
    assert bound_command(SupervisorConfig(command=["x", "y"])) == (["x", "y"], "unbound")


def test_launcher_requires_a_command():
    with pytest.raises(SystemExit):
        launcher_main(["--cpus", "0", "--"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"command": []}, "command must not be empty"),
        ({"cpus": ()}, "cpus must be non-empty"),
        ({"mem_node": -1}, "mem_node must be >= 0"),
        ({"backoff_initial_s": 0}, "backoff_initial_s"),
        ({"max_startup_failures": 0}, "max_startup_failures"),
        ({"ready_url": "127.0.0.1:8000/ready"}, "ready_url must be an http"),
        ({"ready_url": "http:///ready"}, "ready_url must be an http"),
        ({"probe_interval_s": 0}, "probe_interval_s must be > 0"),
        ({"probe_timeout_s": -1}, "probe_timeout_s must be > 0"),
        ({"stall_restart_after_s": 0}, "stall_restart_after_s must be > 0"),
        ({"engine_address": ("127.0.0.1", 0)}, "engine_address must be"),
    ],
)
def test_bad_config_is_refused(overrides, message):
    values = {"command": ["x"], **overrides}
    with pytest.raises(ValueError, match=message):
        SupervisorConfig(**values)


def test_stop_waits_for_a_drain_by_default():
    assert SupervisorConfig(command=["x"]).stop_timeout_s == 35.0  # inferd serve's 30 s --shutdown-timeout + 5


# -- readiness: a child serving /ready, its answer read from a file the test writes --

ENGINE = r"""
import http.server, json, os, signal, sys, time
port, state_file, log_file, drain_s = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])

def note(event):
    with open(log_file, "a") as f:
        f.write(f"{os.getpid()} {event}\n")

def on_term(signum, frame):
    note("sigterm")
    time.sleep(drain_s)  # in-flight requests finishing
    note("drained")
    os._exit(0)

if drain_s >= 0:
    signal.signal(signal.SIGTERM, on_term)
else:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # an engine that never finishes its drain

class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(state_file) as f:
            state = f.read().strip()
        if state == "ready":
            status, body = 200, {"status": "ready"}
        else:
            status, body = 503, {"error": {"message": state, "type": "service_unavailable", "param": None, "code": state}}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

http.server.HTTPServer.allow_reuse_address = True
http.server.HTTPServer(("127.0.0.1", port), Ready).serve_forever()
"""


class FakeEngine:
    """The command for a supervised child serving /ready, and the files that steer and record it."""

    def __init__(self, tmp_path, state="loading", drain_s=0.2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.script = tmp_path / "engine.py"
        self.script.write_text(ENGINE)
        self.state_file = tmp_path / "state"
        self.log_file = tmp_path / "events"
        self.set(state)
        self.command = [
            sys.executable,
            str(self.script),
            str(self.port),
            str(self.state_file),
            str(self.log_file),
            str(drain_s),
        ]
        self.ready_url = f"http://127.0.0.1:{self.port}/ready"

    def set(self, state: str) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(state)
        tmp.replace(self.state_file)  # the child never reads half a file

    def events(self, pid: int) -> list[str]:
        lines = self.log_file.read_text().splitlines() if self.log_file.exists() else []
        return [line.split()[1] for line in lines if line.split()[0] == str(pid)]


def probed_config(engine: FakeEngine, **overrides) -> SupervisorConfig:
    values = dict(
        ready_url=engine.ready_url,
        probe_interval_s=0.1,
        probe_timeout_s=0.5,
        stall_restart_after_s=1.0,
        healthy_after_s=0.2,
    )
    values.update(overrides)
    return fast_config(engine.command, **values)


def test_engine_is_up_only_once_ready_and_loading_or_draining_never_restart(tmp_path):
    engine = FakeEngine(tmp_path, state="loading")
    supervisor = Supervisor(probed_config(engine))
    supervisor.start()
    try:
        assert wait_for(lambda: supervisor.readiness == "loading")
        first = supervisor.pid
        text = scrape(EngineCollector(supervisor))
        assert "inferd_engine_up 0.0" in text
        assert 'inferd_engine_ready_state{state="loading"} 1.0' in text
        assert 'inferd_engine_ready_state{state="ready"} 0.0' in text
        time.sleep(1.5)  # past stall_restart_after_s: loading for that long is not a stall
        assert supervisor.pid == first and supervisor.restarts == 0

        engine.set("ready")
        assert wait_for(lambda: supervisor.is_ready)
        text = scrape(EngineCollector(supervisor))
        assert "inferd_engine_up 1.0" in text and 'inferd_engine_ready_state{state="ready"} 1.0' in text

        for state in ("draining", "loading"):
            engine.set(state)
            assert wait_for(lambda state=state: supervisor.readiness == state)
            assert not supervisor.restart(f"test: asked while {state}")
            time.sleep(1.5)
            assert supervisor.pid == first and supervisor.restarts == 0 and supervisor.stall_restarts == 0
    finally:
        supervisor.stop()
    assert supervisor.readiness == "not_running"
    assert 'inferd_engine_ready_state{state="not_running"} 1.0' in scrape(EngineCollector(supervisor))


@pytest.mark.parametrize("stuck", ["engine_stalled", "engine_dead"])
def test_engine_stalled_past_the_bound_is_restarted_once(tmp_path, stuck):
    engine = FakeEngine(tmp_path, state="ready")
    supervisor = Supervisor(probed_config(engine))
    supervisor.start()
    try:
        assert wait_for(lambda: supervisor.is_ready)
        first = supervisor.pid
        engine.set(stuck)  # shorter than stall_restart_after_s (1 s): a hiccup, not a stall
        assert wait_for(lambda: supervisor.readiness == stuck)
        time.sleep(0.3)
        engine.set("ready")
        assert wait_for(lambda: supervisor.is_ready)
        assert supervisor.pid == first and supervisor.stall_restarts == 0

        engine.set(stuck)
        assert wait_for(lambda: supervisor.readiness == stuck)
        text = scrape(EngineCollector(supervisor))
        assert "inferd_engine_up 0.0" in text and f'inferd_engine_ready_state{{state="{stuck}"}} 1.0' in text
        assert wait_for(lambda: supervisor.pid not in (None, first))
        engine.set("ready")  # the fresh engine makes progress
        assert wait_for(lambda: supervisor.is_ready)
        assert engine.events(first) == ["sigterm", "drained"]
        assert supervisor.restarts == 1 and supervisor.stall_restarts == 1
        text = scrape(EngineCollector(supervisor))
        assert "inferd_engine_restarts_total 1.0" in text and "inferd_engine_stall_restarts_total 1.0" in text
        assert "inferd_engine_up 1.0" in text
    finally:
        supervisor.stop()


def test_sigstopped_engine_stops_answering_and_is_restarted(tmp_path):
    engine = FakeEngine(tmp_path, state="ready")
    supervisor = Supervisor(probed_config(engine))
    supervisor.start()
    first = None
    try:
        assert wait_for(lambda: supervisor.is_ready)
        first = supervisor.pid
        os.kill(first, signal.SIGSTOP)  # alive, answers nothing: every probe times out
        assert wait_for(lambda: supervisor.readiness == "unreachable")
        assert wait_for(lambda: supervisor.pid not in (None, first))
        assert wait_for(lambda: supervisor.is_ready)
        assert supervisor.stall_restarts == 1 and supervisor.restarts == 1
        assert engine.events(first) == ["sigterm", "drained"]  # SIGCONT let it see SIGTERM
    finally:
        supervisor.stop()
        if first is not None and _alive(first):
            os.kill(first, signal.SIGKILL)


def test_engine_silent_before_it_was_ever_ready_is_not_restarted(tmp_path):
    engine = FakeEngine(tmp_path, state="loading")
    supervisor = Supervisor(probed_config(engine))
    supervisor.start()
    first = None
    try:
        assert wait_for(lambda: supervisor.readiness == "loading")
        first = supervisor.pid
        os.kill(first, signal.SIGSTOP)
        assert wait_for(lambda: supervisor.readiness == "unreachable")
        time.sleep(1.5)  # a server still starting up does not answer either
        assert supervisor.pid == first and supervisor.stall_restarts == 0
    finally:
        if first is not None:
            os.kill(first, signal.SIGCONT)
        supervisor.stop()


def test_stop_lets_the_engine_drain_and_exit_without_sigkill(tmp_path):
    engine = FakeEngine(tmp_path, state="ready", drain_s=0.5)
    supervisor = Supervisor(probed_config(engine, stop_timeout_s=5.0))
    supervisor.start()
    assert wait_for(lambda: supervisor.is_ready)
    pid = supervisor.pid
    process = supervisor._process
    supervisor.stop()
    assert engine.events(pid) == ["sigterm", "drained"]
    assert process.returncode == 0  # exited on its own, not -SIGKILL


def test_stop_during_a_restart_does_not_cut_the_drain_short(tmp_path):
    engine = FakeEngine(tmp_path, state="ready", drain_s=1.0)
    supervisor = Supervisor(probed_config(engine, stop_timeout_s=5.0))
    supervisor.start()
    assert wait_for(lambda: supervisor.is_ready)
    pid = supervisor.pid
    process = supervisor._process
    assert wait_for(lambda: supervisor.restart("test"))
    assert wait_for(lambda: engine.events(pid) == ["sigterm"])
    supervisor.stop()  # a second SIGTERM would make inferd serve stop at once
    assert engine.events(pid) == ["sigterm", "drained"]
    assert process.returncode == 0
    assert not supervisor.is_up


def test_stop_kills_an_engine_that_does_not_finish_draining(tmp_path):
    engine = FakeEngine(tmp_path, state="ready", drain_s=-1)  # ignores SIGTERM
    supervisor = Supervisor(probed_config(engine, stop_timeout_s=0.5))
    supervisor.start()
    assert wait_for(lambda: supervisor.is_ready)
    process = supervisor._process
    supervisor.stop()
    assert process.returncode == -signal.SIGKILL


def test_engine_that_exits_0_after_an_asked_restart_is_started_again(tmp_path):
    engine = FakeEngine(tmp_path, state="ready")
    # one start-up failure would be a crash loop: the drained exits must not count as such
    supervisor = Supervisor(probed_config(engine, max_startup_failures=1))
    supervisor.start()
    try:
        for n in (1, 2, 3):
            assert wait_for(lambda: supervisor.is_ready)
            pid = supervisor.pid
            assert wait_for(lambda: supervisor.restart("test"))  # once past the start-up window
            assert wait_for(lambda pid=pid: supervisor.pid not in (None, pid))
            assert engine.events(pid) == ["sigterm", "drained"]
            assert supervisor.restarts == n
        assert not supervisor.crash_looping
    finally:
        supervisor.stop()


def test_loading_seconds_count_while_the_engine_loads_and_reset_when_it_is_ready(tmp_path):
    engine = FakeEngine(tmp_path, state="loading")
    supervisor = Supervisor(probed_config(engine))
    supervisor.start()
    try:
        assert wait_for(lambda: supervisor.loading_seconds > 0.3)
        assert "inferd_engine_loading_seconds" in scrape(EngineCollector(supervisor))
        engine.set("ready")
        assert wait_for(lambda: supervisor.is_ready)
        assert supervisor.loading_seconds == 0.0
    finally:
        supervisor.stop()


LISTENER = """
import socket, sys, time
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen()
print("listening", flush=True)
time.sleep(600)
"""

# an "agent" that starts a listener as its engine (in a session of its own, with its pid in
# INFERD_AGENT_PID, as the supervisor does) and prints the listener's pid
ORPHANING_AGENT = """
import os, subprocess, sys, time
env = dict(os.environ, INFERD_AGENT_PID=str(os.getpid()))
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=env, start_new_session=True,
                         stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(600)
"""


def test_engine_port_held_by_another_process_starts_no_engine_until_it_is_free():
    port = free_port()
    holder = subprocess.Popen([sys.executable, "-c", LISTENER, str(port)], stdout=subprocess.PIPE, text=True)
    supervisor = None
    try:
        assert holder.stdout.readline().strip() == "listening"
        supervisor = Supervisor(fast_config(SLEEPER, engine_address=("127.0.0.1", port)))
        supervisor.start()
        assert wait_for(lambda: supervisor.port_conflict is not None)
        assert f"engine port 127.0.0.1:{port} is held by pid {holder.pid}" in supervisor.port_conflict
        time.sleep(0.3)  # several retries: none of them starts an engine beside the holder
        assert supervisor.generation == 0 and not supervisor.is_up and not supervisor.crash_looping
        assert _alive(holder.pid) and supervisor.orphan_stopped is None  # not the agent's to stop
        holder.kill()
        holder.wait()
        assert wait_for(lambda: supervisor.is_up)
        assert supervisor.port_conflict is None and supervisor.generation == 1
    finally:
        holder.kill()
        holder.wait()
        if supervisor is not None:
            supervisor.stop()


def test_orphaned_engine_holding_the_port_is_stopped_and_replaced():
    port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-c", ORPHANING_AGENT, LISTENER, str(port)], stdout=subprocess.PIPE, text=True
    )
    orphan = int(agent.stdout.readline())
    supervisor = None
    try:
        agent.kill()  # SIGKILL: the listener lives on, its agent gone
        agent.wait()
        assert _alive(orphan)
        supervisor = Supervisor(fast_config(SLEEPER, engine_address=("127.0.0.1", port)))
        supervisor.start()
        assert wait_for(lambda: supervisor.is_up)
        assert not _alive(orphan)
        assert f"stopped orphaned engine pid {orphan}" in supervisor.orphan_stopped
        assert f"whose agent (pid {agent.pid}) is gone" in supervisor.orphan_stopped
        assert supervisor.port_conflict is None
    finally:
        if _alive(orphan):
            os.kill(orphan, signal.SIGKILL)
        if supervisor is not None:
            supervisor.stop()


def test_engine_is_told_which_agent_it_dies_with(tmp_path):
    out = tmp_path / "env"
    command = [sys.executable, "-c", f"import os; open({str(out)!r}, 'w').write(os.environ['INFERD_AGENT_PID'])"]
    supervisor = Supervisor(fast_config(command))
    supervisor.start()
    try:
        assert wait_for(lambda: out.exists() and out.read_text())
        assert out.read_text() == str(os.getpid())
    finally:
        supervisor.stop()
