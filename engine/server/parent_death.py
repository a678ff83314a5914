"""Dying with the parent: an engine its agent started must not outlive the agent.

The agent names itself in `INFERD_AGENT_PID` when it starts `inferd serve`; the server
asks the kernel for SIGTERM on its parent's death (prctl PR_SET_PDEATHSIG, Linux), which
drains it as a SIGTERM from the agent would, and its engine core asks for SIGKILL on the
server's death. Each then checks its parent once more: a parent that died before the
request was made has already handed the child to another process, and no signal will
come. The same variable lets a later agent recognise an engine whose agent is gone.

The kernel sends the signal when the *thread* that started the child ends, not the
whole process: a parent must start such children from a thread that lives as long as
they should (the supervisor's loop, the server's event loop).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Mapping

log = logging.getLogger(__name__)

AGENT_PID_ENV = "INFERD_AGENT_PID"
PR_SET_PDEATHSIG = 1


def die_with_parent(ancestor_pid: int, signum: int) -> bool:
    """Have the kernel send `signum` to this process when its parent dies. False when
    `ancestor_pid` is no longer among this process's ancestors (it died first); raises
    OSError where prctl fails."""
    if not sys.platform.startswith("linux"):
        raise OSError(f"PR_SET_PDEATHSIG is Linux-only, not available on {sys.platform}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signum), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    return ancestor_pid in ancestors(os.getpid())


def ancestors(pid: int, procfs_root: str = "/proc") -> list[int]:
    """`pid`'s parent, its parent and so on, from /proc/PID/stat; stops at pid 1 or at a
    process that has gone."""
    found: list[int] = []
    while pid > 1 and len(found) < 4096:
        try:
            with open(f"{procfs_root}/{pid}/stat") as stat:
                # the command name in parentheses may itself hold spaces and parentheses
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        found.append(pid)
    return found


def follow_parent(ancestor_pid: int, signum: int) -> bool:
    """`die_with_parent`, with a warning (and True) where the kernel cannot do it."""
    try:
        return die_with_parent(ancestor_pid, signum)
    except OSError as exc:
        log.warning("this process will not die with process %d: %s", ancestor_pid, exc)
        return True


def follow_agent(env: Mapping[str, str], signum: int) -> str | None:
    """With `INFERD_AGENT_PID` set, arrange to receive `signum` when that agent dies: None
    when arranged (or not asked for), else why this process must not run on."""
    value = env.get(AGENT_PID_ENV)
    if not value:
        return None
    try:
        agent_pid = int(value)
    except ValueError:
        return f"{AGENT_PID_ENV}={value!r} is not a process id"
    if not follow_parent(agent_pid, signum):
        return f"the agent (pid {agent_pid}) that started this engine is gone"
    return None
