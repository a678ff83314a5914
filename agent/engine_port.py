"""Who holds the engine's port, and stopping an engine whose agent is gone.

Before it starts an engine the supervisor tries to bind the engine's address itself: a
port that is taken would only make `inferd serve` exit with "Address already in use",
again and again. The holder is found through procfs (the listening socket's inode in
/proc/net/tcp{,6}, then the process with that inode among its descriptors) and is one of:

- an orphaned engine: its environment names the agent that started it
  (`INFERD_AGENT_PID`) and that agent is no longer among its ancestors (it was killed,
  and a later agent runs now). Nobody supervises it, so the agent stops it and starts its
  own engine.
- anything else (another agent's engine, a hand-started `inferd serve`, an unrelated
  server, a process procfs does not show): not the agent's to stop. It starts no engine
  while the port stays taken and says who holds it.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from inferd.agent.stack import is_running
from inferd.engine.server.parent_death import AGENT_PID_ENV, ancestors

TCP_LISTEN = "0A"


@dataclass(frozen=True, slots=True)
class PortHolder:
    pid: int | None  # None: procfs does not show which process it is
    command: str = ""
    agent_pid: int | None = None  # the agent named in its environment
    is_orphaned_engine: bool = False

    def describe(self) -> str:
        if self.pid is None:
            return "a process this agent cannot see"
        what = f"pid {self.pid}" + (f" ({self.command})" if self.command else "")
        if self.is_orphaned_engine:
            return f"{what}, an engine whose agent (pid {self.agent_pid}) is gone"
        if self.agent_pid is not None:
            return f"{what}, an engine of the running agent pid {self.agent_pid}"
        return what


def port_is_free(host: str, port: int) -> bool:
    """Whether the engine could bind `host:port` now (as `inferd serve` does, SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def listening_inodes(port: int, procfs_root: str | os.PathLike = "/proc") -> set[str]:
    """Socket inodes of TCP listeners on `port` (any address), from /proc/net/tcp and tcp6."""
    inodes: set[str] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (Path(procfs_root) / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def process_with_socket(inodes: set[str], procfs_root: str | os.PathLike = "/proc") -> int | None:
    """The first process that has one of these socket inodes open (only processes whose
    descriptors this user may read)."""
    targets = {f"socket:[{inode}]" for inode in inodes}
    for entry in Path(procfs_root).iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in targets:
                    return int(entry.name)
        except OSError:  # not ours to read, or gone meanwhile
            continue
    return None


def describe_process(pid: int, procfs_root: str | os.PathLike = "/proc") -> PortHolder:
    root = Path(procfs_root)
    try:
        command = (root / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        command = ""
    agent_pid = None
    try:
        for item in (root / str(pid) / "environ").read_bytes().split(b"\0"):
            key, _, value = item.partition(b"=")
            if key.decode(errors="replace") == AGENT_PID_ENV and value.isdigit():
                agent_pid = int(value)
    except OSError:  # another user's process: not one this agent started
        pass
    orphaned = agent_pid is not None and agent_pid not in ancestors(pid, str(procfs_root))
    return PortHolder(pid, command[:200], agent_pid, orphaned)


def port_holder(host: str, port: int, procfs_root: str | os.PathLike = "/proc") -> PortHolder | None:
    """None while the engine could bind `host:port`, else who holds it."""
    if port_is_free(host, port):
        return None
    pid = process_with_socket(listening_inodes(port, procfs_root), procfs_root)
    return PortHolder(None) if pid is None else describe_process(pid, procfs_root)


def stop_process(pid: int, timeout_s: float, poll_s: float = 0.05) -> bool:
    """SIGTERM to `pid`'s process group when it leads one (an engine started in a session of
    its own), else to `pid`; SIGKILL after `timeout_s`. Whether it has stopped."""
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        return True

    def send(signum: int) -> None:
        try:
            if group == pid:
                os.killpg(group, signum)
            else:
                os.kill(pid, signum)
        except ProcessLookupError:
            pass

    send(signal.SIGTERM)
    send(signal.SIGCONT)  # a stopped process must run to see SIGTERM
    deadline = time.monotonic() + timeout_s
    while is_running(pid) and time.monotonic() < deadline:
        time.sleep(poll_s)
    if is_running(pid):
        send(signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while is_running(pid) and time.monotonic() < deadline:
            time.sleep(poll_s)
    return not is_running(pid)
