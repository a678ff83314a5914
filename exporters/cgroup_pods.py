"""Which pod a process runs in: its cgroup path, and the GPUs it holds open.

The kubelet puts each container in a cgroup under `kubepods` whose path names the pod's
UID and the container's id. Both cgroup drivers and both cgroup versions spell it:

- cgroupfs driver: `/kubepods/burstable/pod<uid>/<container id>` (Guaranteed pods sit
  straight under `/kubepods/pod<uid>/`); v1 lists it once per controller, v2 once (`0::`).
- systemd driver: `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid
  with _ for ->.slice/<runtime>-<container id>.scope` (`cri-containerd-`, `crio-`,
  `docker-`), Guaranteed pods as `kubepods-pod<uid>.slice`.
- Nested runtimes (kind, a node in a container) prefix the path (`/docker/<id>/kubepods/...`);
  the kubepods part is found wherever it sits.

Neither names the pod or its namespace; those come from the pod-resources answer: a
process holding `/dev/nvidia<minor>` open belongs to the container the kubelet gave that
GPU (the minor mapped to the GPU's UUID by /proc/driver/nvidia/gpus/*/information), and
every other process of the same pod and container id is labelled alike.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from inferd.exporters.pod_resources import PodRef, PodResources, unique

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# the pod segment: cgroupfs `pod<uid>`, systemd `kubepods[-qos]-pod<uid_>.slice` (kind: `kubelet-kubepods-...`)
_POD = re.compile(rf"(?:^|/)(?:[a-z][a-z0-9]*-)*pod(?P<uid>{_UID})(?:\.slice)?(?=/|$)")
# the container segment right under the pod: a bare id, or `<runtime>-<id>.scope`
_CONTAINER = re.compile(r"^(?:(?P<runtime>[a-z][a-z0-9-]*?)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$")
_NVIDIA_DEV = re.compile(r"^/dev/nvidia(\d+)$")


@dataclass(frozen=True, slots=True)
class PodCgroup:
    """The pod UID (with dashes) and container id a cgroup path names; the id is empty
    for the pod's own cgroup (its sandbox, or a process the runtime has not moved yet)."""

    pod_uid: str
    container_id: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(_UID, self.pod_uid) or "_" in self.pod_uid:
            raise ValueError(f"pod UID {self.pod_uid!r} is not a dashed UUID")


def parse_cgroup_path(path: str) -> PodCgroup | None:
    """A pod's UID and container id from one cgroup path, or None outside kubepods."""
    if "kubepods" not in path:
        return None
    matches = list(_POD.finditer(path))
    if not matches:
        return None
    match = matches[-1]  # the innermost pod segment: nested kubepods belong to the inner kubelet
    uid = match.group("uid").replace("_", "-")
    rest = path[match.end() :].lstrip("/").split("/", 1)[0]
    container = _CONTAINER.match(rest) if rest else None
    return PodCgroup(uid, container.group("id") if container else "")


def parse_proc_cgroup(text: str) -> PodCgroup | None:
    """The pod of a /proc/PID/cgroup: the v2 line (`0::`) or any v1 controller's line,
    the one naming a container preferred (v1 controllers may disagree for a moment)."""
    found: list[PodCgroup] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        parsed = parse_cgroup_path(parts[2])
        if parsed is not None:
            found.append(parsed)
    with_container = [p for p in found if p.container_id]
    candidates = with_container or found
    return candidates[0] if candidates else None


def open_gpu_minors(procfs_root: Path, pid: int) -> set[int]:
    """Minor numbers of the /dev/nvidiaN files process `pid` holds open (empty when its fds
    cannot be read: gone, or not ours to read)."""
    minors: set[int] = set()
    try:
        fds = list((procfs_root / str(pid) / "fd").iterdir())
    except OSError:
        return minors
    for fd in fds:
        try:
            match = _NVIDIA_DEV.match(os.readlink(fd))
        except OSError:
            continue
        if match:
            minors.add(int(match.group(1)))
    return minors


def parse_gpu_information(text: str) -> tuple[int, str] | None:
    """(Device Minor, GPU UUID) from /proc/driver/nvidia/gpus/<address>/information."""
    minor = uuid = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "Device Minor" and value.isdigit():
            minor = int(value)
        elif key == "GPU UUID" and value:
            uuid = value
    return (minor, uuid) if minor is not None and uuid else None


class ProcessPods:
    """pid -> the container it runs in, for the eBPF collector's watched processes."""

    def __init__(self, procfs_root: str | os.PathLike, resources: PodResources):
        self.proc = Path(procfs_root)
        self.resources = resources
        # (pod uid, container id) -> the container, learned from processes that hold a GPU
        self._known: dict[tuple[str, str], PodRef] = {}

    def gpu_uuids_by_minor(self) -> dict[int, str]:
        found: dict[int, str] = {}
        for info in sorted((self.proc / "driver/nvidia/gpus").glob("*/information")):
            try:
                parsed = parse_gpu_information(info.read_text())
            except OSError:
                continue
            if parsed is not None:
                found[parsed[0]] = parsed[1]
        return found

    def cgroup_of(self, pid: int) -> PodCgroup | None:
        try:
            return parse_proc_cgroup((self.proc / str(pid) / "cgroup").read_text())
        except OSError:
            return None

    def gpu_minors(self, pid: int) -> set[int]:
        return open_gpu_minors(self.proc, pid)

    def gpu_pids(self) -> list[int]:
        """Processes in a pod that hold open a GPU the kubelet gave to a container: what the
        eBPF probes watch in Kubernetes, where no supervisor names the engine's pid."""
        owners = self.resources.owners()
        if not owners:
            return []
        uuids = self.gpu_uuids_by_minor()
        pids = []
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if self.cgroup_of(pid) is None:
                continue
            if any(uuids.get(minor) in owners for minor in self.gpu_minors(pid)):
                pids.append(pid)
        return sorted(pids)

    def resolve(self, pids: list[int]) -> dict[int, PodRef]:
        """The container of each pid that the kubelet's answer and the cgroups place."""
        cgroups = {pid: self.cgroup_of(pid) for pid in pids}
        if not any(cgroups.values()):
            return {}
        owners = self.resources.owners()
        uuids = self.gpu_uuids_by_minor() if owners else {}
        for pid, cgroup in cgroups.items():
            if cgroup is None:
                continue
            refs = [owners[u] for u in (uuids.get(m) for m in self.gpu_minors(pid)) if u in owners]
            ref = unique(refs)
            if ref is not None:
                self._known[(cgroup.pod_uid, cgroup.container_id)] = ref
        live = {(c.pod_uid, c.container_id) for c in cgroups.values() if c is not None}
        for key in set(self._known) - live:
            del self._known[key]  # the container is gone, or its processes are no longer watched
        return {
            pid: self._known[(c.pod_uid, c.container_id)]
            for pid, c in cgroups.items()
            if c is not None and (c.pod_uid, c.container_id) in self._known
        }
