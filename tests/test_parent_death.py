"""An engine dies with the agent that started it, and an engine core with its server:
an agent killed with SIGKILL leaves no engine behind, even one still loading its model."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from inferd.agent.engine_port import is_running

REPO = Path(__file__).resolve().parent.parent

# a middle process ("the agent") starts CHILD with its own pid in INFERD_AGENT_PID, passes
# on the child's first line (its pid) and waits to be killed
AGENT = """
import os, subprocess, sys, time
env = dict(os.environ, INFERD_AGENT_PID=str(os.getpid()))
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=env, stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
time.sleep(600)
"""
FOLLOWER = """
import os, signal, time
from inferd.engine.server.parent_death import follow_agent
assert follow_agent(os.environ, signal.SIGTERM) is None
print(os.getpid(), flush=True)
time.sleep(600)
"""
# the engine core's entry point in a spawned child whose model takes forever to load
CORE_PARENT = """
import multiprocessing, os, sys, time
sys.path.insert(0, sys.argv[1])
from inferd.engine.config import EngineConfig
from inferd.engine.server.engine_core import CoreOptions, run_engine_core
from test_parent_death import load_forever
options = CoreOptions(EngineConfig(model=sys.argv[2]), "ipc:///nonexistent/in", "ipc:///nonexistent/out",
                      os.getpid(), engine_factory=load_forever)
core = multiprocessing.get_context("spawn").Process(target=run_engine_core, args=(options,))
core.start()
print(core.pid, flush=True)
time.sleep(600)
"""


def load_forever(config):
    time.sleep(600)


def wait_until_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while is_running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not is_running(pid)


def test_a_process_following_its_agent_dies_when_the_agent_is_killed():
    agent = subprocess.Popen([sys.executable, "-c", AGENT, FOLLOWER], stdout=subprocess.PIPE, text=True)
    follower = int(agent.stdout.readline())
    try:
        assert is_running(follower)
        agent.kill()
        agent.wait()
        assert wait_until_gone(follower), "the follower outlived its agent"
    finally:
        if is_running(follower):
            os.kill(follower, 9)


def test_serve_refuses_to_start_when_its_agent_is_already_gone(tmp_path):
    """The agent may die before the engine asks for the parent-death signal: the engine
    checks, and does not run on unsupervised."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        result = subprocess.run(
            [sys.executable, "-m", "inferd.agent.cli", "serve", "--model", str(tmp_path), "--port", "1"],
            env={**os.environ, "INFERD_AGENT_PID": str(stranger.pid)},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        stranger.kill()
        stranger.wait()
    assert result.returncode == 1, result.stderr
    assert f"the agent (pid {stranger.pid}) that started this engine is gone; not starting" in result.stderr


def test_engine_core_loading_its_model_dies_with_its_server(tiny_model):
    server = subprocess.Popen(
        [sys.executable, "-c", CORE_PARENT, str(Path(__file__).parent), tiny_model],
        stdout=subprocess.PIPE,
        text=True,
    )
    core = int(server.stdout.readline())
    try:
        time.sleep(0.5)
        assert is_running(core)
        server.kill()
        server.wait()
        assert wait_until_gone(core, timeout=60), "the engine core outlived its server"
    finally:
        if is_running(core):
            os.kill(core, 9)
