"""The stack's processes: started in a process group of their own with the stack's marker
(`INFERD_STACK_RUN_DIR`) in their environment, found again by that marker (so `down` also
stops descendants that left their group, such as the engine the agent starts), waited on
until healthy, stopped with SIGTERM and then SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from .components import Component
from .config import REPO
from .endpoints import answers

MARKER = "INFERD_STACK_RUN_DIR"


def is_running(pid: int) -> bool:
    """True for a live process; a zombie (exited, waiting for its parent to reap it) is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def marked_pids(run_dir: Path) -> list[int]:
    """Live processes whose environment carries this stack's marker."""
    needle = f"{MARKER}={run_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and is_running(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def terminate(pids: list[int], pgids: list[int], timeout_s: float) -> list[int]:
    """SIGTERM groups and pids, wait, then SIGKILL what is left; returns pids that survived."""
    for pgid in pgids:
        signal_group(pgid, signal.SIGTERM)
    for pid in pids:
        signal_pid(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(is_running(p) for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if is_running(p)]
    for pgid in pgids:
        signal_group(pgid, signal.SIGKILL)
    for pid in left:
        signal_pid(pid, signal.SIGKILL)
    time.sleep(0.2)
    return [p for p in pids if is_running(p)]


def start(component: Component, run_dir: Path) -> subprocess.Popen:
    log = open(run_dir / f"{component.name}.log", "ab")
    env = {**os.environ, MARKER: str(run_dir), **dict(component.env)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    try:
        return subprocess.Popen(
            component.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=run_dir,
            env=env,
            start_new_session=True,  # own process group: down signals it whole
        )
    finally:
        log.close()


def wait_healthy(component: Component, process: subprocess.Popen, deadline: float, run_dir: Path) -> None:
    urls = (component.health_url, *component.extra_health_urls)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{component.name} exited with code {process.returncode}\n{log_tail(run_dir, component.name)}"
            )
        if all(answers(u) for u in urls):
            return
        time.sleep(0.25)
    raise RuntimeError(
        f"{component.name} not healthy at {', '.join(urls)} in time\n{log_tail(run_dir, component.name)}"
    )


def log_tail(run_dir: Path, name: str, lines: int = 15) -> str:
    path = run_dir / f"{name}.log"
    if not path.exists():
        return ""
    tail = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join(f"  {name}| {line}" for line in tail)


def engine_pid(run_dir: Path, agent_pid: int) -> int | None:
    """The `inferd serve` process the agent started: a child of the agent carrying the
    stack's marker whose command line runs `serve`."""
    for pid in marked_pids(run_dir):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == agent_pid and b"serve" in argv:
            return pid
    return None
