"""Engine supervision with small Python children: restart, give-up, binding, clean stop."""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from agent.supervisor import EngineCollector, Supervisor, SupervisorConfig, bound_command, launcher_main
from fixture_trees import scrape

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


def test_repeated_startup_failure_stops_the_loop_with_the_error():
    crash = [sys.executable, "-c", "import sys; sys.exit('error: model directory /nope has no config.json')"]
    errors = []
    supervisor = Supervisor(fast_config(crash, max_startup_failures=3), on_give_up=errors.append)
    supervisor.start()
    assert supervisor.wait(timeout=20)
    assert supervisor.has_given_up
    assert "3 times" in supervisor.error and "has no config.json" in supervisor.error
    assert errors == [supervisor.error]
    assert supervisor.restarts == 2


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
    ],
)
def test_bad_config_is_refused(overrides, message):
    values = {"command": ["x"], **overrides}
    with pytest.raises(ValueError, match=message):
        SupervisorConfig(**values)
