"""The five NUMA probes: what each compiles, where it attaches, how its map is read.

Each probe is optional: one that cannot load (a missing tracepoint, no kfunc or kprobe
support) leaves the others running. `load_probes` compiles the tracepoint probes into one
BPF object and falls back to one object per probe when that fails; `load_probe` loads
one. A probe that cannot load gets `ProbeUnavailable` with a reason fit for the agent
log. bcc is imported only inside the load, so importing this module never needs it.

Counting happens in-kernel in per-CPU maps; `LoadedProbe.read()` sums the CPUs once per
collection. Keys are decoded to plain tuples:

    page_allocs       (tgid, node, locality)   locality 0 local, 1 remote, 2 unknown
    numa_hint_faults  (tgid, is_remote)
    page_migrations   (reason,)                the kernel's migrate_reason value
    task_numa_moves   (tgid, kind)             kind 0 move, 1 swap, 2 stick
    page_faults       (tgid,)

tgid 0 stands for every process that is not watched; the kernel counts those in a small
per-CPU array (``<table>_other``) rather than the hash, the cheaper path for the events
that are most of them, and `read()` merges both.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferd.ebpf.node_map import FrameRange
from inferd.ebpf.tracefs import function_tracing_problem, has_event
from inferd.ebpf.watch import COMM_LEN

C_DIR = Path(__file__).with_name("c")

PAGE_ALLOCS = "page_allocs"
NUMA_HINT_FAULTS = "numa_hint_faults"
PAGE_MIGRATIONS = "page_migrations"
TASK_NUMA_MOVES = "task_numa_moves"
PAGE_FAULTS = "page_faults"

# Capability bits (include/uapi/linux/capability.h).
CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39


class ProbeUnavailable(Exception):
    """The probe cannot be loaded here; the message says why."""


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    name: str
    sources: tuple[str, ...]  # files under ebpf/c, compiled after watched.h
    tracepoints: tuple[str, ...]  # category:event, all must exist
    table: str
    key_fields: tuple[str, ...]  # names of the key's fields; one name for a scalar key
    other_slot_key: Callable[[int], tuple[int, ...]] | None = None  # "other" array slot -> key tail
    raw_tracepoint: bool = False  # attached as a raw tracepoint (no event record built)

    def __post_init__(self) -> None:
        if not self.key_fields:
            raise ValueError(f"probe {self.name}: key_fields is empty")
        if self.other_slot_key is not None and self.key_fields[0] != "tgid":
            raise ValueError(f"probe {self.name}: an 'other' array needs per-process keys")
        for source in self.sources:
            if not (C_DIR / source).is_file():
                raise ValueError(f"probe {self.name}: source {source} not found in {C_DIR}")

    @property
    def other_table(self) -> str | None:
        return f"{self.table}_other" if self.other_slot_key else None


MAX_NODES = 64  # page_allocs.c


def _alloc_slot_key(slot: int) -> tuple[int, int]:
    return slot // 3 - 1, slot % 3  # (node, locality); node -1 is "in no range"


PROBES: dict[str, ProbeSpec] = {
    spec.name: spec
    for spec in (
        ProbeSpec(
            PAGE_ALLOCS,
            ("page_allocs.c",),
            ("kmem:mm_page_alloc",),
            "page_allocs",
            ("tgid", "node", "locality"),
            _alloc_slot_key,
        ),
        ProbeSpec(
            NUMA_HINT_FAULTS,
            ("numa_hint_faults_common.h",),
            (),
            "numa_hint_faults",
            ("tgid", "remote"),
            lambda slot: (slot,),
        ),
        ProbeSpec(
            PAGE_MIGRATIONS, ("page_migrations.c",), ("migrate:mm_migrate_pages",), "page_migrations", ("reason",)
        ),
        ProbeSpec(
            TASK_NUMA_MOVES,
            ("task_numa_moves.c",),
            ("sched:sched_move_numa", "sched:sched_swap_numa", "sched:sched_stick_numa"),
            "task_numa_moves",
            ("tgid", "kind"),
            lambda slot: (slot,),
        ),
        ProbeSpec(
            PAGE_FAULTS,
            ("page_faults.c",),
            ("exceptions:page_fault_user",),
            "page_faults",
            ("tgid",),
            lambda slot: (),
            raw_tracepoint=True,
        ),
    )
}


def program_text(spec: ProbeSpec, extra: Iterable[str] = ()) -> str:
    parts = ["watched.h", *spec.sources, *extra]
    return "\n".join((C_DIR / part).read_text() for part in parts)


def parse_cap_eff(status_text: str) -> int:
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise ValueError("no CapEff line in /proc/<pid>/status")


def bpf_permission_problem(procfs_root: str | Path = "/proc") -> str | None:
    """Why this process may not load tracing BPF programs, or None when it may."""
    caps = parse_cap_eff(Path(procfs_root, "self/status").read_text())
    has = lambda bit: bool(caps >> bit & 1)  # noqa: E731
    if has(CAP_SYS_ADMIN) or (has(CAP_BPF) and has(CAP_PERFMON)):
        return None
    return f"not permitted to load BPF: needs CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN (CapEff={caps:#x})"


def _import_bcc():
    try:
        import bcc  # the distribution's python3-bpfcc, linked by scripts/link_bcc.sh
    except ImportError as exc:
        raise ProbeUnavailable(
            f"bcc not importable ({exc}); install python3-bpfcc and run scripts/link_bcc.sh"
        ) from None
    return bcc


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """bcc and libbpf print the compiler's and verifier's reasons to fd 2; keep a copy.

    Whatever reached fd 2 meanwhile (from bcc or any other thread) is written back to it
    afterwards, so nothing is lost from the log.
    """
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured = sink.read()
            if captured:
                os.write(2, captured)
            lines.extend(line for line in captured.decode(errors="replace").splitlines() if line.strip())


def _explain(exc: Exception, stderr: list[str]) -> str:
    """bcc's exception text plus the first compiler error or loader failure it printed."""
    detail = next((line for line in stderr if "error:" in line), None)
    detail = detail or next((line for line in stderr if "failed" in line.lower()), "")
    message = str(exc).strip() or type(exc).__name__
    if message.startswith("Need super-user privileges"):
        # bcc says this for any EPERM; load_probe runs only once capabilities were checked,
        # so here it is the kernel refusing this kind of program (e.g. fentry without
        # dynamic ftrace), not a missing privilege.
        message = "the kernel refused to load it"
    return f"{message} ({detail.strip()})" if detail else message


def _compile(bcc, text: str):
    """Compile, load and attach; on failure free what bcc built and say why.

    bcc attaches ``*_PROBE`` programs inside its constructor, and an object whose
    attach fails there is never cleaned up (about 25 MiB of compiler state stays). So
    the constructor only compiles, and the attach runs here where a failure can be
    undone.
    """

    class CompileOnly(bcc.BPF):
        def _trace_autoload(self):
            pass

    failure, bpf = None, None
    with _captured_stderr() as stderr:
        try:
            bpf = CompileOnly(text=text.encode())
            bcc.BPF._trace_autoload(bpf)
            return bpf
        except Exception as exc:  # bcc raises bare Exception for compile and load errors
            failure = exc
            if bpf is not None:
                bpf.cleanup()
    raise ProbeUnavailable(_explain(failure, stderr))


def kprobes_offered(sysfs_root: str | Path, tracefs: Path) -> bool:
    """A kernel offers kprobes through the perf kprobe PMU or tracefs kprobe_events."""
    return Path(sysfs_root, "bus/event_source/devices/kprobe").exists() or (tracefs / "kprobe_events").exists()


class BpfObject:
    """One compiled BPF object and the watch-list maps its programs share.

    Several probes may live in one object (compiled together to save compile time and
    memory); it is unloaded when the last of them closes.
    """

    def __init__(self, bpf):
        self.bpf = bpf
        self._comm_key_type = bpf[b"watched_comms"].Key
        self._comms_loaded: tuple[str, ...] | None = None
        self._generation = 0
        self._users = 0

    def set_watched(self, pids: Iterable[int], comms: Iterable[str]) -> None:
        """Make the kernel's watch list exactly ``pids`` (plus pids it adds by comm)."""
        table = self.bpf[b"watched_pids"]
        wanted = {int(p) for p in pids if p and int(p) > 0}
        for key in list(table.keys()):
            if key.value not in wanted:
                with contextlib.suppress(KeyError):
                    del table[key]
        for pid in wanted:
            table[table.Key(pid)] = table.Leaf(1)
        comms = tuple(comms)
        if comms != self._comms_loaded:
            self._comms_loaded = comms
            comm_table = self.bpf[b"watched_comms"]
            comm_table.clear()
            for comm in comms:
                key = self._comm_key_type()
                key.comm = comm.encode()[:COMM_LEN]  # the rest stays NUL, as in the kernel
                comm_table[key] = comm_table.Leaf(1)
        config = self.bpf[b"watch_config"]
        config[config.Key(0)] = config.Leaf(len(comms))
        self._bump_generation()

    def unwatch(self, tgids: Iterable[int]) -> None:
        watched = self.bpf[b"watched_pids"]
        for tgid in tgids:
            with contextlib.suppress(KeyError):
                del watched[watched.Key(tgid)]
        self._bump_generation()

    def _bump_generation(self) -> None:
        """Empties the kernel's per-CPU watch caches (watched.h)."""
        self._generation += 1
        config = self.bpf[b"watch_config"]
        config[config.Key(1)] = config.Leaf(self._generation)

    def acquire(self) -> BpfObject:
        self._users += 1
        return self

    def release(self) -> None:
        self._users -= 1
        if self._users == 0:
            self.bpf.cleanup()


class LoadedProbe:
    """One probe's programs and maps: map reads, forgetting exited processes, detaching."""

    def __init__(self, spec: ProbeSpec, bpf_object: BpfObject, attach: str):
        self.spec = spec
        self.attach = attach  # "tracepoint", "raw_tracepoint", "kfunc" or "kprobe"
        self.is_attached = True  # bcc attaches *_PROBE-macro programs when it loads them
        self.bpf_object = bpf_object.acquire()
        self._bpf = bpf_object.bpf

    @property
    def name(self) -> str:
        return self.spec.name

    def set_watched(self, pids: Iterable[int], comms: Iterable[str]) -> None:
        """Set the watch list of this probe's BPF object (shared with probes compiled with it)."""
        self.bpf_object.set_watched(pids, comms)

    def read(self) -> dict[tuple[int, ...], int]:
        """Counts summed over CPUs, keyed as described in the module docstring."""
        table = self._bpf[self.spec.table.encode()]
        out: dict[tuple[int, ...], int] = {}
        for key, per_cpu in table.items():
            total = sum(per_cpu)
            if total:
                out[self._decode(key)] = total
        other_table, other_slot_key = self.spec.other_table, self.spec.other_slot_key
        if other_table and other_slot_key is not None:  # the table exists exactly with the key function
            for slot, per_cpu in self._bpf[other_table.encode()].items():
                total = sum(per_cpu)
                if total:
                    key = (0, *other_slot_key(slot.value))
                    out[key] = out.get(key, 0) + total
        return out

    def _decode(self, key) -> tuple[int, ...]:
        if hasattr(key, "_fields_"):
            return tuple(getattr(key, field) for field in self.spec.key_fields)
        return (key.value,)

    @property
    def is_per_process(self) -> bool:
        return self.spec.key_fields[0] == "tgid"

    def forget(self, tgids: Iterable[int]) -> None:
        """Drop the keys of processes that are gone (the caller folds their counts)."""
        gone = set(tgids)
        if not self.is_per_process or not gone:
            return
        table = self._bpf[self.spec.table.encode()]
        for key in list(table.keys()):
            if self._decode(key)[0] in gone:
                with contextlib.suppress(KeyError):
                    del table[key]
        self.bpf_object.unwatch(gone)

    def load_node_maps(self, ranges: list[FrameRange], cpu_nodes: dict[int, int]) -> None:
        """Load the frame-range and CPU-node maps (page_allocs only)."""
        if self.spec.name != PAGE_ALLOCS:
            raise ValueError(f"probe {self.name} has no node maps")
        range_table = self._bpf[b"frame_ranges"]
        too_high = sorted({r.node for r in ranges} | set(cpu_nodes.values()))
        if too_high and too_high[-1] >= MAX_NODES:
            raise ValueError(f"node {too_high[-1]} is beyond the probe's {MAX_NODES} nodes")
        if len(ranges) > len(range_table):
            raise ValueError(f"{len(ranges)} frame ranges exceed the probe's {len(range_table)} slots")
        count = self._bpf[b"num_frame_ranges"]
        count[count.Key(0)] = count.Leaf(0)  # the probe counts nothing while the maps change
        for index, r in enumerate(sorted(ranges, key=lambda r: r.start_pfn)):
            range_table[range_table.Key(index)] = range_table.Leaf(r.start_pfn, r.end_pfn, r.node, 0)
        cpu_table = self._bpf[b"cpu_nodes"]
        for cpu in range(len(cpu_table)):
            node = cpu_nodes.get(cpu, -1)
            if cpu_table[cpu_table.Key(cpu)].value != node:
                cpu_table[cpu_table.Key(cpu)] = cpu_table.Leaf(node)
        count[count.Key(0)] = count.Leaf(len(ranges))

    def set_attached(self, attached: bool) -> None:
        """Detach or re-attach a tracepoint probe's programs, keeping its maps (benchmarks)."""
        if self.attach not in ("tracepoint", "raw_tracepoint"):
            raise ValueError(f"probe {self.name} is attached by {self.attach}, not by tracepoints")
        if attached == self.is_attached:
            return
        self.is_attached = attached
        for tracepoint in self.spec.tracepoints:
            program = self._program_name(tracepoint).encode()
            if self.spec.raw_tracepoint:
                event = tracepoint.partition(":")[2].encode()
                if attached:
                    self._bpf.attach_raw_tracepoint(tp=event, fn_name=program)
                else:
                    self._bpf.detach_raw_tracepoint(tp=event)
            elif attached:
                self._bpf.attach_tracepoint(tp=tracepoint.encode(), fn_name=program)
            else:
                self._bpf.detach_tracepoint(tracepoint.encode())

    def program_fds(self) -> dict[str, int]:
        """This probe's program name -> fd (its /proc/self/fdinfo has run counts with bpf_stats)."""
        mine = {self._program_name(tp) for tp in self.spec.tracepoints} or None
        return {name.decode(): fn.fd for name, fn in self._bpf.funcs.items() if mine is None or name.decode() in mine}

    def _program_name(self, tracepoint: str) -> str:
        category, _, event = tracepoint.partition(":")
        return f"raw_tracepoint__{event}" if self.spec.raw_tracepoint else f"tracepoint__{category}__{event}"

    def close(self) -> None:
        """Detach this probe's programs; the object is unloaded when its last probe closes."""
        if self.bpf_object is None:
            return
        if self.attach in ("tracepoint", "raw_tracepoint"):
            with contextlib.suppress(Exception):  # bcc raises bare Exception; closing must not fail
                self.set_attached(False)
        self.bpf_object.release()
        self.bpf_object = None  # type: ignore[assignment]  # closed; the attribute is typed for open probes


def _check_loadable(spec: ProbeSpec, tracefs: Path | None) -> tuple[Any, Path]:
    """(bcc, tracefs), once the probe's tracepoints are known to exist; else ProbeUnavailable."""
    if tracefs is None:
        raise ProbeUnavailable("tracefs is not mounted (tried /sys/kernel/tracing, /sys/kernel/debug/tracing)")
    missing = [tp for tp in spec.tracepoints if not has_event(tracefs, tp)]
    if missing:
        raise ProbeUnavailable(f"kernel has no tracepoint {', '.join(missing)}")
    return _import_bcc(), tracefs


def _attach_kind(spec: ProbeSpec) -> str:
    return "raw_tracepoint" if spec.raw_tracepoint else "tracepoint"


def load_probe(spec: ProbeSpec, *, tracefs: Path | None, sysfs_root: str | Path = "/sys") -> LoadedProbe:
    """Compile and attach one probe on its own, or raise ProbeUnavailable saying why."""
    bcc, found_tracefs = _check_loadable(spec, tracefs)
    if spec.name == NUMA_HINT_FAULTS:
        return _load_hint_faults(bcc, spec, found_tracefs, sysfs_root)
    return LoadedProbe(spec, BpfObject(_compile(bcc, program_text(spec))), _attach_kind(spec))


def load_probes(
    specs: Iterable[ProbeSpec], *, tracefs: Path | None, sysfs_root: str | Path = "/sys"
) -> tuple[dict[str, LoadedProbe], dict[str, str]]:
    """Load several probes: (loaded by name, reason by name for those that are not).

    The tracepoint probes are compiled into one BPF object first (one compiler run, one
    set of maps for the watch list); if that fails, each is compiled on its own so one
    broken probe cannot take the others down, and its own reason is reported.
    """
    loaded: dict[str, LoadedProbe] = {}
    down: dict[str, str] = {}
    together: list[ProbeSpec] = []
    for spec in specs:
        try:
            bcc, found_tracefs = _check_loadable(spec, tracefs)
            if spec.name == NUMA_HINT_FAULTS:  # kfunc/kprobe attach can fail on its own
                loaded[spec.name] = _load_hint_faults(bcc, spec, found_tracefs, sysfs_root)
            else:
                together.append(spec)
        except ProbeUnavailable as exc:
            down[spec.name] = str(exc)
    if len(together) > 1:
        sources = [source for spec in together for source in spec.sources]
        text = "\n".join((C_DIR / part).read_text() for part in ["watched.h", *sources])
        try:
            shared = BpfObject(_compile(_import_bcc(), text))
        except ProbeUnavailable:
            pass  # fall through to one object per probe, to find which one fails and why
        else:
            return {**loaded, **{spec.name: LoadedProbe(spec, shared, _attach_kind(spec)) for spec in together}}, down
    for spec in together:
        try:
            loaded[spec.name] = load_probe(spec, tracefs=tracefs, sysfs_root=sysfs_root)
        except ProbeUnavailable as exc:
            down[spec.name] = str(exc)
    return loaded, down


def _load_hint_faults(bcc, spec: ProbeSpec, tracefs: Path, sysfs_root: str | Path) -> LoadedProbe:
    """task_numa_fault has no tracepoint: try a kfunc (fentry), then a kprobe."""
    attempts: list[str] = []
    not_traceable = function_tracing_problem(tracefs, "task_numa_fault")
    if not_traceable:
        attempts.append(f"no kfunc: {not_traceable}")
    elif bcc.BPF.support_kfunc():
        try:
            return LoadedProbe(
                spec, BpfObject(_compile(bcc, program_text(spec, ["numa_hint_faults_kfunc.c"]))), "kfunc"
            )
        except ProbeUnavailable as exc:
            attempts.append(f"kfunc task_numa_fault failed: {exc}")
    else:
        attempts.append("kernel offers no kfunc (fentry) attachment")
    if not kprobes_offered(sysfs_root, tracefs):
        attempts.append("kernel offers no kprobes (no kprobe PMU, no kprobe_events)")
        raise ProbeUnavailable("; ".join(attempts))
    try:
        bpf = _compile(bcc, program_text(spec, ["numa_hint_faults_kprobe.c"]))
    except ProbeUnavailable as exc:
        attempts.append(f"kprobe program failed: {exc}")
        raise ProbeUnavailable("; ".join(attempts)) from None
    failure = None
    with _captured_stderr() as stderr:
        try:
            bpf.attach_kprobe(event=b"task_numa_fault", fn_name=b"on_task_numa_fault")
        except Exception as exc:
            failure = exc
    if failure is None:
        return LoadedProbe(spec, BpfObject(bpf), "kprobe")
    bpf.cleanup()
    attempts.append(f"kprobe task_numa_fault failed: {_explain(failure, stderr)}")
    raise ProbeUnavailable("; ".join(attempts))
