"""What the remediation policy may ask of the engine's supervisor: report on a restart,
and rebind the running engine to its GPU's NUMA node.

`SupervisorHost` adapts `agent.supervisor.Supervisor` to the policy's `EngineHost`
protocol. The supervisor already restarts a dead engine with backoff; the policy's
`restart_engine` reports where that stands (and fails loudly while the engine is in a
crash loop, since another restart would not help). `rebind_engine` moves the engine's pages to
its node with migrate_pages(2) and resets every thread's CPU affinity to the node's
CPUs.
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path
from typing import Any

SYS_MIGRATE_PAGES = {"x86_64": 256, "aarch64": 238}
_ULONG_BITS = ctypes.sizeof(ctypes.c_ulong) * 8


def online_nodes(sysfs_root: str | os.PathLike = "/sys") -> list[int]:
    """NUMA node ids from <sysfs>/devices/system/node/online ("0-1,3")."""
    text = (Path(sysfs_root) / "devices/system/node/online").read_text().strip()
    nodes: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        nodes.extend(range(int(low), int(high or low) + 1))
    return nodes


def migrate_pages(pid: int, to_node: int, nodes: list[int]) -> int:
    """Move `pid`'s pages from every other node in `nodes` to `to_node`; pages not moved."""
    number = SYS_MIGRATE_PAGES.get(platform.machine())
    if number is None:
        raise OSError(f"migrate_pages: unsupported machine {platform.machine()}")
    if to_node not in nodes or max(nodes) >= _ULONG_BITS:
        raise ValueError(f"node {to_node} not among online nodes {nodes} (at most {_ULONG_BITS} supported)")
    old_mask = sum(1 << n for n in nodes if n != to_node)
    if not old_mask:
        return 0  # one node: nothing can be remote
    libc = ctypes.CDLL(None, use_errno=True)
    old, new = ctypes.c_ulong(old_mask), ctypes.c_ulong(1 << to_node)
    # maxnode counts bits plus one: the kernel decrements it first (a historic quirk).
    left = libc.syscall(number, pid, _ULONG_BITS + 1, ctypes.byref(old), ctypes.byref(new))
    if left < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"migrate_pages(pid {pid} -> node {to_node}): {os.strerror(err)}")
    return left


class SupervisorHost:
    def __init__(
        self, supervisor: Any, sysfs_root: str | os.PathLike = "/sys", procfs_root: str | os.PathLike = "/proc"
    ):
        self.supervisor = supervisor
        self.sysfs_root = Path(sysfs_root)
        self.procfs_root = Path(procfs_root)

    def restart_engine(self) -> str:
        sup = self.supervisor
        if sup.crash_looping:
            raise RuntimeError(f"the engine is in a crash loop: {sup.error}")
        if sup.port_conflict:
            raise RuntimeError(sup.port_conflict)
        if sup.is_up:
            # The process runs but the alert says it does not answer: a hung engine.
            pid = sup.pid
            if sup.restart("InferdEngineDown: the engine process runs but does not answer"):
                return f"restarted the unresponsive engine (pid {pid}); {sup.restarts} restart(s) before"
            # Failing (rather than succeeding with nothing done) spends no cooldown.
            raise RuntimeError(f"engine pid {pid} is still starting; not restarted")
        return f"the supervisor is restarting the engine ({sup.restarts} restart(s) so far)"

    def rebind_engine(self) -> str:
        sup = self.supervisor
        pid, node, cpus = sup.pid, sup.config.mem_node, sup.config.cpus
        if pid is None:
            raise RuntimeError("the engine is not running")
        if node is None or not cpus:
            raise RuntimeError("the engine has no NUMA node and CPU list assigned (single-node host?)")
        not_moved = migrate_pages(pid, node, online_nodes(self.sysfs_root))
        threads = 0
        for task in (self.procfs_root / str(pid) / "task").iterdir():
            try:
                os.sched_setaffinity(int(task.name), cpus)
                threads += 1
            except ProcessLookupError:
                continue  # the thread ended meanwhile
        return f"engine pid {pid}: pages migrated to node {node} ({not_moved} not moved), {threads} thread(s) pinned to CPUs {sorted(cpus)}"
