"""eBPF NUMA probes.

Parsers, watch lists and the collector's no-permission path run anywhere. Tests marked
`root` load BPF programs into the running kernel: they need root, bcc (python3-bpfcc
linked by scripts/link_bcc.sh) and kernel headers (scripts/link_kernel_headers.sh), and
skip saying which is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from inferd.ebpf.node_map import FrameRange, merge_ranges, parse_zoneinfo, read_cpu_nodes, read_frame_ranges
from inferd.ebpf.probes import PROBES, bpf_permission_problem, parse_cap_eff
from inferd.ebpf.tracefs import find_tracefs, function_tracing_problem, parse_print_symbolic
from inferd.ebpf.watch import DepartedProcessFolder, WatchList
from inferd.exporters.ebpf_numa import EbpfNumaCollector

REPO = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")

MIGRATE_FORMAT = """name: mm_migrate_pages
format:
\tfield:int reason;\toffset:60;\tsize:4;\tsigned:1;

print fmt: "nr_succeeded=%lu mode=%s reason=%s", REC->succeeded, __print_symbolic(REC->mode, {0, "MIGRATE_ASYNC"}, {1, "MIGRATE_SYNC_LIGHT"}, {2, "MIGRATE_SYNC"}), __print_symbolic(REC->reason, {0, "compaction"}, {1, "memory_failure"}, {2, "memory_hotplug"}, {3, "syscall_or_cpuset"}, {4, "mempolicy_mbind"}, {5, "numa_misplaced"}, {6, "contig_range"}, {7, "longterm_pin"}, {8, "demotion"})
"""

ZONEINFO = """Node 0, zone      DMA
  pages free     3
        spanned  4095
        present  3998
  start_pfn:           1
Node 0, zone   Normal
        spanned  1000
        present  1000
  start_pfn:           4096
Node 0, zone  Movable
        spanned  0
        present  0
Node 1, zone   Normal
        spanned  2000
        present  2000
  start_pfn:           8192
"""


# -- parsers and readers on plain strings and fixture trees ------------------------------


def test_migrate_reasons_come_from_the_format_file():
    reasons = parse_print_symbolic(MIGRATE_FORMAT, "reason")
    assert reasons[3] == "syscall_or_cpuset"
    assert reasons[5] == "numa_misplaced"
    assert len(reasons) == 9
    assert parse_print_symbolic(MIGRATE_FORMAT, "mode") == {
        0: "MIGRATE_ASYNC",
        1: "MIGRATE_SYNC_LIGHT",
        2: "MIGRATE_SYNC",
    }


def test_missing_symbolic_table_is_a_clear_error():
    with pytest.raises(ValueError, match="no __print_symbolic table for field 'nope'"):
        parse_print_symbolic(MIGRATE_FORMAT, "nope")


def test_zoneinfo_spans_merge_per_node_and_skip_empty_zones():
    assert parse_zoneinfo(ZONEINFO) == [FrameRange(1, 5096, 0), FrameRange(8192, 10192, 1)]


def test_overlapping_ranges_of_two_nodes_are_refused():
    with pytest.raises(ValueError, match="overlap"):
        merge_ranges([FrameRange(0, 100, 0), FrameRange(50, 150, 1)])
    with pytest.raises(ValueError, match="empty"):
        FrameRange(10, 10, 0)


def _node_tree(root: Path, blocks: dict[int, list[int]], cpus: dict[int, str], block_size: int) -> Path:
    sysfs = root / "sys"
    memory = sysfs / "devices/system/memory"
    memory.mkdir(parents=True)
    (memory / "block_size_bytes").write_text(f"{block_size:x}\n")
    for node, ids in blocks.items():
        node_dir = sysfs / f"devices/system/node/node{node}"
        node_dir.mkdir(parents=True)
        (node_dir / "cpulist").write_text(cpus[node] + "\n")
        for block in ids:
            (memory / f"memory{block}").mkdir()
            (node_dir / f"memory{block}").symlink_to(memory / f"memory{block}")
    return sysfs


def test_frame_ranges_from_memory_blocks_merge_and_keep_holes(tmp_path):
    block = 128 << 20
    sysfs = _node_tree(tmp_path, {0: [0, 1, 2, 5], 1: [6, 7]}, {0: "0-3", 1: "4-7"}, block)
    per_block = block // 4096
    assert read_frame_ranges(sysfs, tmp_path / "proc", page_size=4096) == [
        FrameRange(0, 3 * per_block, 0),
        FrameRange(5 * per_block, 6 * per_block, 0),
        FrameRange(6 * per_block, 8 * per_block, 1),
    ]
    assert read_cpu_nodes(sysfs) == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}


def test_frame_ranges_fall_back_to_zoneinfo_without_memory_blocks(tmp_path):
    (tmp_path / "sys/devices/system/node/node0").mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/zoneinfo").write_text(ZONEINFO)
    assert read_frame_ranges(tmp_path / "sys", tmp_path / "proc")[-1] == FrameRange(8192, 10192, 1)
    (tmp_path / "proc/zoneinfo").unlink()
    with pytest.raises(FileNotFoundError, match="zoneinfo"):
        read_frame_ranges(tmp_path / "sys", tmp_path / "proc")


def test_function_tracing_problem_reads_the_ftrace_list(tmp_path, monkeypatch):
    assert function_tracing_problem(tmp_path, "task_numa_fault") is None  # no list: only trying tells
    (tmp_path / "available_filter_functions").write_text("do_numa_page\ntask_numa_fault [kvm]\n")
    assert function_tracing_problem(tmp_path, "task_numa_fault") is None
    assert "not traceable" in function_tracing_problem(tmp_path, "numa_migrate_prep")

    def refuse(self, *args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(Path, "open", refuse)
    assert "does not permit function tracing" in function_tracing_problem(tmp_path, "task_numa_fault")


def test_capability_check_names_what_is_missing(tmp_path):
    status = tmp_path / "self/status"
    status.parent.mkdir()
    status.write_text("Name:\tx\nCapEff:\t0000000000000000\n")
    assert "needs CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN" in bpf_permission_problem(tmp_path)
    status.write_text(f"CapEff:\t{(1 << 39) | (1 << 38):016x}\n")
    assert bpf_permission_problem(tmp_path) is None
    status.write_text(f"CapEff:\t{1 << 39:016x}\n")  # CAP_BPF alone cannot attach tracepoints
    assert bpf_permission_problem(tmp_path) is not None
    assert parse_cap_eff("CapEff:\t000001ffffffffff") == (1 << 41) - 1


# -- watched processes -----------------------------------------------------------------


def _fake_proc(root: Path, comms: dict[int, str]) -> Path:
    for pid, comm in comms.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
    return root


def test_watch_list_unites_callable_fixed_pids_and_comms(tmp_path):
    proc = _fake_proc(tmp_path, {10: "engine", 11: "bash", 12: "vllm-worker", 13: "vllm-worker"})
    watch = WatchList(proc, pids_fn=lambda: 10, pids=(99,), comms=("vllm-worker",))
    assert watch.resolve() == {10, 99, 12, 13}
    assert watch.comm_of(12) == "vllm-worker"
    assert watch.comm_of(0) == "other"


def test_watch_list_survives_a_failing_callable_and_rejects_bad_input(tmp_path, caplog):
    def broken():
        raise RuntimeError("supervisor not ready")

    assert WatchList(tmp_path, pids_fn=broken, pids=(7,)).resolve() == {7}
    assert "watch_pids_fn failed" in caplog.text
    assert WatchList(tmp_path, pids_fn=lambda: None).resolve() == set()
    with pytest.raises(ValueError, match="watched pid must be a positive integer"):
        WatchList(tmp_path, pids=(0,))
    with pytest.raises(ValueError, match="1..15 characters"):
        WatchList(tmp_path, comms=("a-name-longer-than-15",))


def test_departed_processes_fold_into_other_and_stay_monotonic():
    folder = DepartedProcessFolder()
    alive = {10: True, 11: True}
    rows = {(0, 0, 0): 5, (10, 0, 0): 100, (11, 0, 1): 7}
    out, exited = folder.fold(rows, alive.get)
    assert out == rows and exited == set()
    alive[10] = False
    out, exited = folder.fold({(0, 0, 0): 6, (10, 0, 0): 120, (11, 0, 1): 8}, alive.get)
    assert exited == {10}
    assert out == {(0, 0, 0): 126, (11, 0, 1): 8}
    # the caller deleted pid 10's kernel keys; its 120 pages stay in "other"
    out, exited = folder.fold({(0, 0, 0): 9, (11, 0, 1): 8}, alive.get)
    assert out == {(0, 0, 0): 129, (11, 0, 1): 8} and exited == set()


# -- the collector without the rights to load BPF ----------------------------------------


def _samples(collector) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for family in collector.collect() for s in family.samples
    }


def test_without_capabilities_every_probe_is_down_with_its_reason(tmp_path, caplog):
    (tmp_path / "self").mkdir()
    (tmp_path / "self/status").write_text("CapEff:\t0000000000000000\n")
    collector = EbpfNumaCollector(procfs_root=tmp_path, watch_pids=(1,))
    with caplog.at_level("WARNING"):
        samples = _samples(collector)
    for probe in PROBES:
        assert samples[("inferd_ebpf_probe_up", (("probe", probe),))] == 0.0
        assert f"ebpf probe {probe} down: not permitted to load BPF" in caplog.text
    assert not any(name.startswith("inferd_ebpf_page") for name, _ in samples)


class FakeProbe:
    """Stands in for a LoadedProbe: fixed map contents, records what the collector asks."""

    attach = "tracepoint"

    def __init__(self, rows: dict[tuple[int, ...], int], is_per_process: bool = True):
        self.rows = rows
        self.is_per_process = is_per_process
        self.watched: tuple[set[int], tuple[str, ...]] | None = None
        self.forgotten: set[int] = set()
        self.bpf_object = self  # each fake is its own "BPF object" with its own watch list

    def read(self) -> dict[tuple[int, ...], int]:
        return {key: n for key, n in self.rows.items() if key[0] not in self.forgotten or not self.is_per_process}

    def set_watched(self, pids, comms) -> None:
        self.watched = (set(pids), tuple(comms))

    def forget(self, tgids) -> None:
        self.forgotten |= set(tgids)

    def close(self) -> None:
        pass


def _fake_collector(tmp_path: Path, balancing: str) -> tuple[EbpfNumaCollector, dict[str, FakeProbe]]:
    proc = _fake_proc(tmp_path / "proc", {4242: "engine", 77: "tokenizer"})
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "sys/kernel/numa_balancing").write_text(balancing + "\n")
    collector = EbpfNumaCollector(procfs_root=proc, watch_pids_fn=lambda: 4242, watch_comms=["tokenizer"])
    probes = {
        "page_allocs": FakeProbe({(0, 0, 0): 100, (0, 1, 1): 7, (4242, 0, 0): 50, (4242, 1, 1): 5, (77, 0, 0): 3}),
        "numa_hint_faults": FakeProbe({(4242, 0): 9, (4242, 1): 2}),
        "page_migrations": FakeProbe({(3,): 12, (40,): 1}, is_per_process=False),
        "task_numa_moves": FakeProbe({(4242, 1): 4}),
        "page_faults": FakeProbe({(0,): 1000, (4242,): 60}),
    }
    collector._started = True  # as if start() had loaded these
    collector._probes = dict(probes)
    collector._migration_reasons = {3: "syscall_or_cpuset", 5: "numa_misplaced"}
    return collector, probes


def _exposition(collector) -> list[str]:
    registry = CollectorRegistry()
    registry.register(collector)
    return [line for line in generate_latest(registry).decode().splitlines() if not line.startswith("#")]


def test_collector_labels_watched_processes_and_sums_the_rest_as_other(tmp_path):
    collector, probes = _fake_collector(tmp_path, balancing="1")
    assert _exposition(collector) == [
        'inferd_ebpf_probe_up{probe="page_allocs"} 1.0',
        'inferd_ebpf_probe_up{probe="numa_hint_faults"} 1.0',
        'inferd_ebpf_probe_up{probe="page_migrations"} 1.0',
        'inferd_ebpf_probe_up{probe="task_numa_moves"} 1.0',
        'inferd_ebpf_probe_up{probe="page_faults"} 1.0',
        'inferd_ebpf_page_allocs_total{comm="other",locality="local",node="0",pid=""} 100.0',
        'inferd_ebpf_page_allocs_total{comm="other",locality="remote",node="1",pid=""} 7.0',
        'inferd_ebpf_page_allocs_total{comm="tokenizer",locality="local",node="0",pid="77"} 3.0',
        'inferd_ebpf_page_allocs_total{comm="engine",locality="local",node="0",pid="4242"} 50.0',
        'inferd_ebpf_page_allocs_total{comm="engine",locality="remote",node="1",pid="4242"} 5.0',
        'inferd_ebpf_numa_hint_faults_total{comm="engine",locality="local",pid="4242"} 9.0',
        'inferd_ebpf_numa_hint_faults_total{comm="engine",locality="remote",pid="4242"} 2.0',
        'inferd_ebpf_page_migrations_total{reason="syscall_or_cpuset"} 12.0',
        'inferd_ebpf_page_migrations_total{reason="numa_misplaced"} 0.0',
        'inferd_ebpf_page_migrations_total{reason="40"} 1.0',
        'inferd_ebpf_task_numa_moves_total{comm="engine",kind="swap",pid="4242"} 4.0',
        'inferd_ebpf_page_faults_total{comm="other",pid=""} 1000.0',
        'inferd_ebpf_page_faults_total{comm="engine",pid="4242"} 60.0',
    ]
    assert probes["page_allocs"].watched == ({4242, 77}, ("tokenizer",))


def test_a_child_that_execs_away_from_a_watched_comm_is_summed_as_other(tmp_path):
    collector, probes = _fake_collector(tmp_path, balancing="0")
    _fake_proc(tmp_path / "proc", {88: "curl"})  # forked by "tokenizer", counted by comm, then exec'd
    probes["page_faults"].rows[(88,)] = 40
    lines = _exposition(collector)
    assert not any('pid="88"' in line for line in lines)
    assert 'inferd_ebpf_page_faults_total{comm="other",pid=""} 1040.0' in lines
    assert 88 in probes["page_faults"].forgotten


def test_exited_engine_moves_to_other_and_balancing_off_hides_hint_faults(tmp_path):
    collector, probes = _fake_collector(tmp_path, balancing="0")
    _exposition(collector)
    shutil.rmtree(tmp_path / "proc/4242")  # the engine exited
    lines = _exposition(collector)
    assert not any('pid="4242"' in line for line in lines)
    assert 'inferd_ebpf_page_allocs_total{comm="other",locality="local",node="0",pid=""} 150.0' in lines
    assert 'inferd_ebpf_page_allocs_total{comm="other",locality="remote",node="1",pid=""} 12.0' in lines
    assert 'inferd_ebpf_page_faults_total{comm="other",pid=""} 1060.0' in lines
    assert 4242 in probes["page_allocs"].forgotten
    assert not any(line.startswith("inferd_ebpf_numa_hint_faults") for line in lines)
    assert not any(line.startswith("inferd_numa_balancing_enabled") for line in lines)  # the NUMA collector's
    collector.export_numa_balancing = True
    assert "inferd_numa_balancing_enabled 0.0" in _exposition(collector)


def test_collect_while_probes_load_reports_the_collector_unavailable(tmp_path):
    from inferd.exporters.registry import CollectorSet, CollectorUnavailable

    collector = EbpfNumaCollector(procfs_root=tmp_path)
    with collector._start_lock:  # what start() holds while compiling in the agent's thread
        with pytest.raises(CollectorUnavailable, match="still loading"):
            list(collector.collect())
        assert 'inferd_collector_up{collector="ebpf"} 0.0' in _exposition(CollectorSet([collector]))


def test_unknown_probe_name_is_refused():
    with pytest.raises(ValueError, match="unknown eBPF probe"):
        EbpfNumaCollector(probes=["page_allocs", "nonsense"])


# -- on the real kernel ------------------------------------------------------------------


def _bpf_prerequisites() -> str | None:
    if os.geteuid() != 0:
        return "needs root to load BPF programs"
    if importlib.util.find_spec("bcc") is None:
        return "bcc not importable: install python3-bpfcc and run scripts/link_bcc.sh"
    if not Path(f"/lib/modules/{os.uname().release}/build").exists():
        return "no kernel headers at /lib/modules/$(uname -r)/build: run scripts/link_kernel_headers.sh"
    return None


needs_bpf = pytest.mark.skipif(_bpf_prerequisites() is not None, reason=str(_bpf_prerequisites()))

# A child that waits for "go", touches N fresh anonymous pages (no THP, so each is one
# base-page allocation), says "touched", and on the next line prints the frame numbers
# of those pages from /proc/self/pagemap (after the test has collected, so the work of
# reading them is not counted), then stays alive until the test kills it.
TOUCH_PAGES = textwrap.dedent(
    """
    import ctypes, json, mmap, os, sys
    num_pages, cpu, comm = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    if cpu >= 0:
        os.sched_setaffinity(0, {cpu})
    if comm:
        ctypes.CDLL(None).prctl(15, comm.encode(), 0, 0, 0)  # PR_SET_NAME
    page = mmap.PAGESIZE
    buf = mmap.mmap(-1, num_pages * page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_NOHUGEPAGE)
    print("ready", flush=True)
    sys.stdin.readline()
    for offset in range(0, num_pages * page, page):
        buf[offset] = 1
    print("touched", flush=True)
    sys.stdin.readline()
    start = ctypes.addressof(ctypes.c_char.from_buffer(buf)) // page
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(start * 8)
        entries = pagemap.read(num_pages * 8)
    pfns = [int.from_bytes(entries[i:i + 8], "little") & ((1 << 55) - 1) for i in range(0, len(entries), 8)]
    print(json.dumps(pfns), flush=True)
    sys.stdin.readline()
    """
)


class Toucher:
    """The TOUCH_PAGES child, driven step by step."""

    def __init__(self, num_pages: int, cpu: int = -1, comm: str = ""):
        self.num_pages = num_pages
        self.proc = subprocess.Popen(
            [sys.executable, "-c", TOUCH_PAGES, str(num_pages), str(cpu), comm],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "ready"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def touch(self) -> None:
        self._send("go")
        assert self.proc.stdout.readline().strip() == "touched"

    def frames(self) -> list[int]:
        self._send("pagemap")
        pfns = json.loads(self.proc.stdout.readline())
        assert all(pfns), "pagemap shows no frame numbers (needs CAP_SYS_ADMIN)"
        return pfns

    def finish(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def _allocs_by(samples: dict, pid: int) -> dict[tuple[str, str], float]:
    out = {}
    for (name, labels), value in samples.items():
        label = dict(labels)
        if name == "inferd_ebpf_page_allocs_total" and label["pid"] == str(pid):
            out[(label["node"], label["locality"])] = value
    return out


class LiveCollector(EbpfNumaCollector):
    """The real collector, watching whatever pids a test puts in ``watched``."""

    def __init__(self) -> None:
        self.watched: set[int] = set()
        super().__init__(watch_pids_fn=lambda: sorted(self.watched), watch_comms=["inferd-touch"])


@pytest.fixture(scope="module")
def live():
    """One collector with every probe loaded (compiling takes a few seconds)."""
    if _bpf_prerequisites():
        pytest.skip(_bpf_prerequisites())
    collector = LiveCollector()
    collector.start()
    yield collector
    collector.close()


@needs_bpf
@pytest.mark.root
@pytest.mark.slow  # shares the `live` fixture, which compiles five programs (4-10 s on 2 busy cores)
def test_every_probe_loads_or_says_why(live):
    reasons = live.probe_reasons
    assert reasons["page_allocs"] is None, reasons["page_allocs"]
    assert reasons["page_migrations"] is None, reasons["page_migrations"]
    tracefs = find_tracefs()
    if (tracefs / "events/exceptions/page_fault_user").exists():
        assert reasons["page_faults"] is None, reasons["page_faults"]
    for probe, reason in reasons.items():
        assert reason is None or len(reason) > 10, (probe, reason)
    if reasons["numa_hint_faults"] is not None:  # a kernel without kfunc and kprobes, like this VM
        assert "task_numa_fault" in reasons["numa_hint_faults"] or "kprobe" in reasons["numa_hint_faults"]


@needs_bpf
@pytest.mark.root
def test_a_probe_that_fails_to_compile_leaves_the_others_loaded(tmp_path, monkeypatch):
    """load_probes compiles probes together, then alone when that fails, to isolate the culprit."""
    from inferd.ebpf import probes

    for source in probes.C_DIR.iterdir():
        shutil.copy(source, tmp_path / source.name)
    (tmp_path / "broken.c").write_text("TRACEPOINT_PROBE(kmem, mm_page_free) { return no_such_thing; }\n")
    monkeypatch.setattr(probes, "C_DIR", tmp_path)
    broken = probes.ProbeSpec("broken", ("broken.c",), ("kmem:mm_page_free",), "page_faults", ("tgid",))
    loaded, down = probes.load_probes([PROBES["page_faults"], broken], tracefs=find_tracefs())
    try:
        assert set(loaded) == {"page_faults"}
        assert "no_such_thing" in down["broken"]
    finally:
        for probe in loaded.values():
            probe.close()


@needs_bpf
@pytest.mark.root
def test_hint_fault_programs_compile_and_the_kprobe_one_verifies():
    """Both task_numa_fault variants, whether or not this kernel can attach them.

    The kprobe program is loaded (verified) without attaching; the kfunc one is only
    compiled, as loading it needs the attach target the kernel may refuse.
    """
    import bcc

    from inferd.ebpf.probes import program_text

    class CompileOnly(bcc.BPF):
        def _trace_autoload(self):
            pass

    spec = PROBES["numa_hint_faults"]
    bpf = bcc.BPF(text=program_text(spec, ["numa_hint_faults_kprobe.c"]).encode())
    try:
        assert bpf.load_func(b"on_task_numa_fault", bcc.BPF.KPROBE).fd > 0
    finally:
        bpf.cleanup()
    kfunc = CompileOnly(text=program_text(spec, ["numa_hint_faults_kfunc.c"]).encode())
    try:
        names = {bcc.lib.bpf_function_name(kfunc.module, i) for i in range(bcc.lib.bpf_num_functions(kfunc.module))}
        assert any(name.endswith(b"task_numa_fault") for name in names), names
    finally:
        kfunc.cleanup()


@needs_bpf
@pytest.mark.root
@pytest.mark.slow  # shares the `live` fixture, which compiles five programs (4-10 s on 2 busy cores)
def test_child_touching_fresh_pages_shows_that_many_local_allocs(live):
    num_pages = 20_000
    child = Toucher(num_pages)
    try:
        live.watched.add(child.pid)
        before = _samples(live)
        child.touch()
        after = _samples(live)
    finally:
        child.finish()
        live.watched.discard(child.pid)
    allocs = _allocs_by(after, child.pid)
    allocated = sum(allocs.values()) - sum(_allocs_by(before, child.pid).values())
    assert allocated >= num_pages
    if len(set(read_cpu_nodes().values())) == 1:
        assert {locality for _, locality in allocs} == {"local"}, allocs
    if live.probe_reasons["page_faults"] is None:
        faults = sum(
            value
            for (name, labels), value in after.items()
            if name == "inferd_ebpf_page_faults_total" and dict(labels)["pid"] == str(child.pid)
        )
        assert faults >= num_pages


@needs_bpf
@pytest.mark.root
@pytest.mark.slow  # shares the `live` fixture, which compiles five programs (4-10 s on 2 busy cores)
def test_watch_comm_gives_a_process_its_own_labels_and_exit_folds_it_into_other(live):
    child = Toucher(5_000, comm="inferd-touch")
    try:
        child.touch()
        samples = _samples(live)
        mine = _allocs_by(samples, child.pid)
        assert sum(mine.values()) >= 5_000, "comm match did not attribute the child's pages"
        labels = {
            dict(lv)["comm"]
            for (n, lv), _ in samples.items()
            if n == "inferd_ebpf_page_allocs_total" and dict(lv)["pid"] == str(child.pid)
        }
        assert labels == {"inferd-touch"}
        other_before = sum(_allocs_by(samples, "").values())
    finally:
        child.finish()
    samples = _samples(live)
    assert _allocs_by(samples, child.pid) == {}
    assert sum(_allocs_by(samples, "").values()) >= other_before + sum(mine.values())


@needs_bpf
@pytest.mark.root
@pytest.mark.slow  # shares the `live` fixture, which compiles five programs (4-10 s on 2 busy cores)
def test_synthetic_two_node_map_predicts_remote_share(live):
    """Split the real frame ranges at a pfn and the CPUs in two; pin the child to CPU 0.

    Which frames the buddy allocator hands out is not ours to choose, so the split is put
    at the median frame of a warm-up child's pages (freed pages are handed out again
    soon, so the next child's pages straddle it), and the expected remote count is taken
    from the measured child's own frame numbers (/proc/self/pagemap): every page it
    touched on synthetic node 1 is remote to CPU 0. Tolerance: 2% of the pages plus 64,
    for the child's page tables and interpreter allocations during the touch.
    """
    cpus = sorted(read_cpu_nodes())
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to split into two synthetic nodes")
    real_ranges = read_frame_ranges()
    num_pages = 20_000
    warmup = Toucher(num_pages, cpu=cpus[0])
    try:
        warmup.touch()
        split_pfn = sorted(warmup.frames())[num_pages // 2]
    finally:
        warmup.finish()
    synthetic = _split_in_two(real_ranges, split_pfn)
    half = len(cpus) // 2
    live.load_node_maps(synthetic, {cpu: 0 if i < half else 1 for i, cpu in enumerate(cpus)})
    child = Toucher(num_pages, cpu=cpus[0])
    try:
        live.watched.add(child.pid)
        before = _allocs_by(_samples(live), child.pid)
        child.touch()
        after = _allocs_by(_samples(live), child.pid)
        pfns = child.frames()
    finally:
        child.finish()
        live.watched.discard(child.pid)
        live.load_node_maps(real_ranges, read_cpu_nodes())
    delta = {key: after.get(key, 0) - before.get(key, 0) for key in after}
    predicted_remote = sum(1 for pfn in pfns if pfn >= split_pfn)
    remote = delta.get(("1", "remote"), 0)
    print(
        f"split at pfn {split_pfn:#x}: predicted remote {predicted_remote}/{num_pages}, counted {remote}, all {delta}"
    )
    assert delta.get(("0", "remote"), 0) == 0 and delta.get(("1", "local"), 0) == 0  # CPU 0 is on node 0
    assert abs(remote - predicted_remote) <= 0.02 * num_pages + 64
    assert abs(delta.get(("0", "local"), 0) - (num_pages - predicted_remote)) <= 0.02 * num_pages + 64


def _split_in_two(ranges: list[FrameRange], split_pfn: int) -> list[FrameRange]:
    out = []
    for r in ranges:
        if r.start_pfn < split_pfn:
            out.append(FrameRange(r.start_pfn, min(r.end_pfn, split_pfn), 0))
        if r.end_pfn > split_pfn:
            out.append(FrameRange(max(r.start_pfn, split_pfn), r.end_pfn, 1))
    return merge_ranges(out)


@needs_bpf
@pytest.mark.root
@pytest.mark.slow  # shares the `live` fixture, which compiles five programs (4-10 s on 2 busy cores)
def test_forced_migration_shows_under_its_reason(live):
    nodes = sorted(set(read_cpu_nodes().values()))
    if len(nodes) < 2:
        pytest.skip(f"one NUMA node on this host (node{nodes[0]}): nothing to migrate pages to")
    import ctypes
    import mmap

    num_pages = 2_000
    reason = ("inferd_ebpf_page_migrations_total", (("reason", "syscall_or_cpuset"),))
    before = _samples(live).get(reason, 0)
    buf = mmap.mmap(-1, num_pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for offset in range(0, num_pages * PAGE, PAGE):
        buf[offset] = 1
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    move_pages, mpol_mf_move = 279, 2  # x86_64
    pages = (ctypes.c_void_p * num_pages)(*[base + i * PAGE for i in range(num_pages)])
    current = (ctypes.c_int * num_pages)()
    status = (ctypes.c_int * num_pages)()
    assert libc.syscall(move_pages, 0, num_pages, pages, None, current, 0) == 0  # where are they now
    target = (ctypes.c_int * num_pages)(*[nodes[1] if node == nodes[0] else nodes[0] for node in current])
    assert libc.syscall(move_pages, 0, num_pages, pages, target, status, mpol_mf_move) >= 0, os.strerror(
        ctypes.get_errno()
    )
    moved = sum(1 for node, wanted in zip(status, target) if node == wanted)
    assert moved > 0, "move_pages moved nothing"
    assert _samples(live).get(reason, 0) - before >= moved


# -- without the rights to load BPF, in a child with capabilities dropped ----------------

NO_CAPS_CHILD = textwrap.dedent(
    """
    import logging, sys
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily
    from inferd.exporters.ebpf_numa import EbpfNumaCollector
    from inferd.exporters.registry import CollectorSet

    class Uptime:
        name = "uptime"
        def collect(self):
            yield GaugeMetricFamily("test_uptime_seconds", "from /proc/uptime",
                                    value=float(open("/proc/uptime").read().split()[0]))

    status = open("/proc/self/status").read()
    print("#", [line for line in status.splitlines() if line.startswith("CapEff")][0])
    registry = CollectorRegistry()
    registry.register(CollectorSet([EbpfNumaCollector(watch_pids=(1,)), Uptime()]))
    sys.stdout.write(generate_latest(registry).decode())
    try:  # past the collector's own check: does the kernel refuse too?
        from inferd.ebpf.probes import PROBES, ProbeUnavailable, load_probe
        from inferd.ebpf.tracefs import find_tracefs
        load_probe(PROBES["page_faults"], tracefs=find_tracefs())
        print("# raw load: loaded")
    except ProbeUnavailable as exc:
        print("# raw load refused:", exc)
    """
)


def test_child_without_bpf_capabilities_reports_each_probe_down(tmp_path):
    drop = "cap_sys_admin,cap_bpf,cap_perfmon"
    if os.geteuid() == 0:
        if not shutil.which("capsh"):
            pytest.skip("capsh (package libcap2-bin) is needed to drop capabilities as root")
        command = ["capsh", f"--drop={drop}", "--", "-c", 'exec "$0" -c "$1"', sys.executable, NO_CAPS_CHILD]
    else:  # an unprivileged user already lacks them
        command = [sys.executable, "-c", NO_CAPS_CHILD]
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert result.returncode == 0, result.stderr
    cap_eff = int(result.stdout.split("CapEff:")[1].split()[0], 16)
    assert not cap_eff & (1 << 21 | 1 << 38 | 1 << 39), f"capabilities not dropped: {cap_eff:#x}"
    for probe in PROBES:
        assert f'inferd_ebpf_probe_up{{probe="{probe}"}} 0.0' in result.stdout
        assert f"ebpf probe {probe} down: not permitted to load BPF" in result.stderr
    assert 'inferd_collector_up{collector="uptime"} 1.0' in result.stdout
    assert "test_uptime_seconds " in result.stdout
    assert "raw load refused" in result.stdout, "the kernel let a process without capabilities load BPF"
    if _bpf_prerequisites() is None:  # bcc present: the refusal came from the kernel
        assert "Operation not permitted" in result.stdout.split("raw load refused")[1]
