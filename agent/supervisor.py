"""Engine supervision: run `inferd serve` as a child bound to a NUMA node, keep it alive.

- Binding: the child's CPU affinity and memory policy are set before the engine's own
  code runs. With `numactl` installed the command is prefixed with
  `numactl --physcpubind=CPUS --membind=NODE`; otherwise with this module's own
  launcher (`python -m inferd.agent.supervisor --cpus ... --membind ... -- CMD`), which calls
  sched_setaffinity and set_mempolicy(MPOL_BIND) through ctypes and then execs the
  command (both survive exec). A launcher keeps the work out of a fork-time
  preexec_fn, which is unsafe in a process with threads. When the memory policy
  cannot be set the launcher logs why and runs with the CPU binding only.
- Restarts: a child that dies is started again after a backoff that doubles from
  `backoff_initial_s` to `backoff_max_s`, and drops back once a child has stayed up
  `healthy_after_s`. The supervisor never gives up, so the agent's metrics and webhook
  outlive any engine fault: a child that dies during start-up (before `healthy_after_s`
  and before it was ever ready) `max_startup_failures` times in a row with the same
  error is in a crash loop: `error` says why, and the backoff grows on to
  `crash_backoff_max_s` until a child runs again. A child that was ready and then died
  (killed, crashed) is never a start-up failure, however soon it died.
- Ready listeners (`add_ready_listener`) are called, in a thread of their own, each
  time a newly started engine process first answers ready: the remediation policy
  re-applies what it believes is in force on a fresh engine.
- Readiness: with `ready_url` set, a probe thread GETs the engine's /ready every
  `probe_interval_s`. An engine that answers `engine_stalled` or `engine_dead`, or that
  stops answering after it was ready (refused, timed out: a SIGSTOPped process), for
  longer than `stall_restart_after_s` is restarted by the supervisor itself. `loading`
  and `draining` never are.
- The engine's port: with `engine_address` set, the supervisor binds it itself before each
  start. An orphaned engine holding it (agent.engine_port: started by an agent that is
  gone) is stopped, said in a log line and in `orphan_stopped`; any other holder is left
  alone, no engine is started, and `port_conflict` names the holder until the port is free.
  The engine gets `INFERD_AGENT_PID` (this process) in its environment and dies with the
  agent (engine.server.parent_death).
- Stop: SIGTERM to the child's process group, which makes `inferd serve` drain
  (in-flight requests finish, up to its --shutdown-timeout), and SIGKILL only after
  `stop_timeout_s`. An engine that exits after a restart the supervisor asked for is
  started again like any other exit; it is never a start-up failure.

`EngineCollector` exports inferd_engine_up (ready), inferd_engine_ready_state,
inferd_engine_restarts_total and inferd_engine_stall_restarts_total.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import http.client
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

import inferd
from inferd.agent.engine_port import port_holder, stop_process
from inferd.engine.server.parent_death import AGENT_PID_ENV

log = logging.getLogger(__name__)

# the folder that holds the inferd package (a source checkout or site-packages): the
# launcher child imports inferd.agent.supervisor from it
IMPORT_ROOT = Path(inferd.__file__).resolve().parent.parent
MPOL_BIND = 2
SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}

# what the engine's /ready answers (its 503 reason codes), plus the supervisor's own two
ENGINE_READINESS = ("ready", "loading", "engine_stalled", "engine_dead", "draining")
READINESS_STATES = ENGINE_READINESS + ("unreachable", "not_running")
STALLED_STATES = frozenset({"engine_stalled", "engine_dead"})  # and "unreachable" once it was ready
# the engine is on the agent's host: an HTTP(S)_PROXY in the environment must not route the probe
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(slots=True)
class SupervisorConfig:
    command: list[str]
    cpus: tuple[int, ...] | None = None  # CPU affinity of the engine; None leaves it alone
    mem_node: int | None = None  # NUMA node for MPOL_BIND; None leaves the policy alone
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    healthy_after_s: float = 10.0
    max_startup_failures: int = 3
    crash_backoff_max_s: float = 300.0  # the longest wait between starts in a crash loop
    stop_timeout_s: float = 35.0  # the engine's default --shutdown-timeout (30 s) to drain, plus 5 s
    env: dict[str, str] | None = None
    use_numactl: bool = True  # prefer numactl when it is installed
    ready_url: str | None = None  # the engine's /ready; None: running counts as ready, no probe
    probe_interval_s: float = 2.0
    probe_timeout_s: float = 2.0
    stall_restart_after_s: float = 30.0
    engine_address: tuple[str, int] | None = None  # where the engine listens; None: not checked

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("SupervisorConfig.command must not be empty")
        if self.cpus is not None and (not self.cpus or min(self.cpus) < 0):
            raise ValueError(f"SupervisorConfig.cpus must be non-empty CPU ids >= 0, got {self.cpus}")
        if self.mem_node is not None and self.mem_node < 0:
            raise ValueError(f"SupervisorConfig.mem_node must be >= 0, got {self.mem_node}")
        if not 0 < self.backoff_initial_s <= self.backoff_max_s <= self.crash_backoff_max_s:
            raise ValueError(
                "need 0 < backoff_initial_s <= backoff_max_s <= crash_backoff_max_s, got "
                f"{self.backoff_initial_s}, {self.backoff_max_s}, {self.crash_backoff_max_s}"
            )
        if self.healthy_after_s < 0 or self.stop_timeout_s <= 0:
            raise ValueError("healthy_after_s must be >= 0 and stop_timeout_s > 0")
        if self.max_startup_failures < 1:
            raise ValueError(f"max_startup_failures must be >= 1, got {self.max_startup_failures}")
        if self.ready_url is not None:
            url = urllib.parse.urlsplit(self.ready_url)
            if url.scheme not in ("http", "https") or not url.netloc:
                raise ValueError(f"SupervisorConfig.ready_url must be an http(s) URL, got {self.ready_url!r}")
        for name in ("probe_interval_s", "probe_timeout_s", "stall_restart_after_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SupervisorConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.engine_address is not None and not (self.engine_address[0] and 0 < self.engine_address[1] < 65536):
            raise ValueError(
                f"SupervisorConfig.engine_address must be (host, port 1..65535), got {self.engine_address}"
            )


def format_cpus(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def bound_command(config: SupervisorConfig) -> tuple[list[str], str]:
    """The command that starts the engine with its binding, and a description of it."""
    if config.cpus is None and config.mem_node is None:
        return list(config.command), "unbound"
    cpus = config.cpus
    if cpus is not None:
        # a container's cpuset can be narrower than the node's CPU list
        allowed = set(cpus) & os.sched_getaffinity(0)
        if not allowed:
            log.warning(
                "none of the engine node's CPUs %s is available to the agent; CPU affinity not set", format_cpus(cpus)
            )
        cpus = tuple(sorted(allowed)) or None
    numactl = shutil.which("numactl") if config.use_numactl else None
    if numactl:
        prefix = [numactl]
        if cpus is not None:
            prefix.append(f"--physcpubind={format_cpus(cpus)}")
        if config.mem_node is not None:
            prefix.append(f"--membind={config.mem_node}")
        how = "numactl"
    else:
        prefix = [sys.executable, "-m", "inferd.agent.supervisor"]
        if cpus is not None:
            prefix += ["--cpus", format_cpus(cpus)]
        if config.mem_node is not None:
            prefix += ["--membind", str(config.mem_node)]
        prefix.append("--")
        how = "sched_setaffinity + set_mempolicy launcher"
    description = f"cpus={format_cpus(cpus) if cpus else 'any'} mem_node={config.mem_node} via {how}"
    return prefix + list(config.command), description


def probe_readiness(url: str, timeout: float) -> str:
    """One GET of the engine's /ready: "ready", the reason code of its 503, or "unreachable"
    (refused, timed out, or an answer that is not the readiness contract)."""
    try:
        with _NO_PROXY_OPENER.open(url, timeout=timeout) as response:
            return "ready" if response.status == 200 else "unreachable"
    except urllib.error.HTTPError as exc:
        try:
            code = json.loads(exc.read())["error"]["code"]
        except (OSError, ValueError, KeyError, TypeError):
            return "unreachable"
        return code if code in ENGINE_READINESS else "unreachable"
    except (OSError, http.client.HTTPException):
        return "unreachable"


class Supervisor:
    def __init__(self, config: SupervisorConfig):
        self.config = config
        self.command, self.binding = bound_command(config)
        self.restarts = 0
        self.stall_restarts = 0  # the restarts the readiness probe asked for
        self.error: str | None = None  # set while in a crash loop: the repeated start-up error
        self.port_conflict: str | None = None  # set while another process holds the engine's port
        self.orphan_stopped: str | None = None  # the last orphaned engine stopped to free the port
        self.generation = 0  # engine processes started so far
        self._ready_listeners: list[Callable[[int], None]] = []
        self._ready_seen: subprocess.Popen | None = None  # the last process seen ready
        self._loading_since: float | None = None  # monotonic time the probe first saw it loading
        self._process: subprocess.Popen | None = None
        self._restarting: subprocess.Popen | None = None  # the process a restart() is stopping
        self._signalled: subprocess.Popen | None = None  # the process SIGTERM went to
        self._last_probe: tuple[subprocess.Popen | None, str] = (None, "unreachable")
        self._spawned_at = 0.0
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine-supervisor", daemon=True)
        self._prober = threading.Thread(target=self._probe_loop, name="engine-probe", daemon=True)
        self._lock = threading.Lock()
        self._pump: threading.Thread | None = None

    # -- state read by collectors and the HTTP app --

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def is_up(self) -> bool:
        return self.pid is not None

    @property
    def readiness(self) -> str:
        """One of READINESS_STATES: the last probe's answer for the running engine."""
        process = self._process
        if process is None or process.poll() is not None:
            return "not_running"
        if self.config.ready_url is None:
            return "ready"
        probed, state = self._last_probe
        return state if probed is process else "unreachable"

    @property
    def is_ready(self) -> bool:
        return self.readiness == "ready"

    @property
    def loading_seconds(self) -> float:
        """How long the running engine has answered `loading` (0 when it does not)."""
        since = self._loading_since
        return time.monotonic() - since if since is not None and self.readiness == "loading" else 0.0

    @property
    def crash_looping(self) -> bool:
        return self.error is not None

    def add_ready_listener(self, listener: Callable[[int], None]) -> None:
        """`listener(generation)` runs once per engine process, when it first answers ready."""
        self._ready_listeners.append(listener)

    def start(self) -> None:
        log.info("starting engine: %s (%s)", " ".join(self.config.command), self.binding)
        self._thread.start()
        if self.config.ready_url is not None:
            self._prober.start()

    def restart(self, reason: str) -> bool:
        """Stop a running engine that no longer answers (the loop then starts a fresh one).
        Refused while the engine is still within its start-up window or says it is loading,
        since a loading engine does not answer either; refused while it drains (it is on its
        way out) or while a restart is already under way. Returns whether a restart was begun."""
        with self._lock:
            process = self._process
            if process is None or process.poll() is not None or process is self._restarting:
                return False
            readiness = self.readiness
            if time.monotonic() - self._spawned_at < self.config.healthy_after_s or readiness == "loading":
                log.info("not restarting engine pid %d (%s): still starting", process.pid, reason)
                return False
            if readiness == "draining":
                log.info("not restarting engine pid %d (%s): it is draining", process.pid, reason)
                return False
            self._restarting = process
        log.warning("restarting engine pid %d: %s", process.pid, reason)
        threading.Thread(target=self._terminate, name="engine-restart", daemon=True).start()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the supervision loop to end (it ends on stop() or on giving up)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        self._stopping.set()
        self._terminate()
        if self._thread.is_alive():
            self._thread.join(timeout=self.config.stop_timeout_s + 5)
        if self._prober.is_alive():
            self._prober.join(timeout=self.config.probe_timeout_s + 1)

    # -- the loop --

    def _loop(self) -> None:
        config = self.config
        backoff = config.backoff_initial_s
        last_error: str | None = None
        same_error_count = 0
        while not self._stopping.is_set():
            if not self._claim_engine_port():
                if self._stopping.wait(backoff):
                    return
                backoff = min(backoff * 2, config.backoff_max_s)
                continue
            started = time.monotonic()
            process: subprocess.Popen | None
            tail: str | None
            try:
                process = self._spawn()
            except OSError as exc:  # the command itself cannot run: as a start-up failure
                process, returncode, tail = None, None, f"cannot start the engine ({self.command[0]}): {exc}"
                log.error("%s", tail)
            else:
                returncode = process.wait()
                tail = self._last_stderr_line()
            ran_for = time.monotonic() - started
            if self._stopping.is_set():
                return
            if process is not None:
                log.warning(
                    "engine (pid %d) exited with %s after %.1f s: %s",
                    process.pid,
                    returncode,
                    ran_for,
                    tail or "no output",
                )
            # restart() refuses inside the start-up window, so an engine that exits (0, drained)
            # on a restart the supervisor asked for has always run past it: never a start-up failure
            was_ready = process is not None and self._ready_seen is process
            if ran_for < config.healthy_after_s and not was_ready:
                error = _describe_exit(returncode, tail)
                same_error_count = same_error_count + 1 if error == last_error else 1
                last_error = error
                if same_error_count >= config.max_startup_failures:
                    self.error = f"engine exited during start-up {same_error_count} times in a row with: {error}"
                    log.error("engine crash loop: %s; retrying in %.0f s", self.error, backoff)
            else:
                last_error, same_error_count, self.error = None, 0, None
                if ran_for >= config.healthy_after_s:
                    backoff = config.backoff_initial_s
            if self._stopping.wait(backoff):
                return
            cap = config.crash_backoff_max_s if self.error is not None else config.backoff_max_s
            backoff = min(backoff * 2, cap)
            with self._lock:
                self.restarts += 1
            log.info("restarting engine (restart %d)", self.restarts)

    def _probe_loop(self) -> None:
        """Probe readiness every probe_interval_s; restart an engine that has been stalled,
        dead, or silent after being ready, for longer than stall_restart_after_s."""
        config = self.config
        ready_url = config.ready_url
        assert ready_url is not None  # start() runs this thread only with a ready_url
        probed: subprocess.Popen | None = None
        was_ready, bad_since = False, None
        while not self._stopping.is_set():
            checked_at = time.monotonic()
            process = self._process
            running = process is not None and process.poll() is None
            state = probe_readiness(ready_url, config.probe_timeout_s) if running else "not_running"
            if process is not probed:  # a new engine process: the old one's history does not apply
                probed, was_ready, bad_since = process, False, None
            self._last_probe = (process, state)
            if state != "loading":
                self._loading_since = None
            elif self._loading_since is None:
                self._loading_since = checked_at
            if state == "ready" and process is not None and process.poll() is not None:
                state = "not_running"  # it exited during the probe: the answer came from another process
                self._last_probe = (process, state)
            if state == "ready" and not was_ready and process is not None:
                self._on_ready(process)
            was_ready = was_ready or state == "ready"
            # before it was ever ready, silence is a server still starting up, not a hang
            if state in STALLED_STATES or (state == "unreachable" and was_ready):
                bad_since = checked_at if bad_since is None else bad_since
                bad_for = checked_at - bad_since
                if bad_for >= config.stall_restart_after_s and not self._stopping.is_set():
                    if self.restart(f"readiness probe: {state} for {bad_for:.1f} s"):
                        with self._lock:
                            self.stall_restarts += 1
            else:
                bad_since = None
            self._stopping.wait(max(0.0, checked_at + config.probe_interval_s - time.monotonic()))

    def _ready_if_running(self, process: subprocess.Popen) -> None:
        if process is self._process and process.poll() is None and not self._stopping.is_set():
            self._on_ready(process)

    def _on_ready(self, process: subprocess.Popen) -> None:
        self._ready_seen = process
        self.error = None  # a crash loop ends when an engine comes up
        generation = self.generation
        for listener in list(self._ready_listeners):

            def call(listener=listener) -> None:
                try:
                    listener(generation)
                except Exception:
                    log.exception("engine ready listener %r failed", listener)

            threading.Thread(target=call, name="engine-ready", daemon=True).start()

    def _claim_engine_port(self) -> bool:
        """Whether the engine's port is free for a new engine, after stopping an orphaned
        engine that held it; otherwise `port_conflict` says who holds it."""
        address = self.config.engine_address
        if address is None:
            return True
        host, port = address
        holder = port_holder(host, port)
        if holder is not None and holder.is_orphaned_engine and holder.pid is not None:
            log.warning("engine port %s:%d is held by %s: stopping it", host, port, holder.describe())
            stop_process(holder.pid, self.config.stop_timeout_s)
            self.orphan_stopped = f"stopped orphaned engine {holder.describe()}"
            log.warning("%s; starting a supervised engine", self.orphan_stopped)
            holder = port_holder(host, port)
        if holder is None:
            self.port_conflict = None
            return True
        conflict = f"engine port {host}:{port} is held by {holder.describe()}; no engine started until it is free"
        if conflict != self.port_conflict:
            log.error("%s", conflict)
        self.port_conflict = conflict
        return False

    def _spawn(self) -> subprocess.Popen:
        env = dict(os.environ if self.config.env is None else self.config.env)
        env[AGENT_PID_ENV] = str(os.getpid())  # the engine dies with this process
        # the launcher runs as `python -m inferd.agent.supervisor`; make sure it is importable
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(IMPORT_ROOT), env.get("PYTHONPATH", "")) if p)
        self._stderr_tail.clear()
        process = subprocess.Popen(
            self.command, env=env, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True
        )
        self._process = process
        self.generation += 1
        self._spawned_at = time.monotonic()
        self._pump = threading.Thread(target=self._pump_stderr, args=(process,), name="engine-stderr", daemon=True)
        self._pump.start()
        if self.config.ready_url is None:  # no probe: running healthy_after_s counts as ready
            timer = threading.Timer(self.config.healthy_after_s, self._ready_if_running, args=(process,))
            timer.daemon = True
            timer.start()
        log.info("engine started, pid %d", process.pid)
        return process

    def _pump_stderr(self, process: subprocess.Popen) -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            line = raw.decode(errors="replace").rstrip()
            if line:
                self._stderr_tail.append(line)
                sys.stderr.write(f"[engine] {line}\n")

    def _last_stderr_line(self) -> str | None:
        if self._pump is not None:
            self._pump.join(timeout=1.0)  # drain what the child wrote before it exited
        return self._stderr_tail[-1] if self._stderr_tail else None

    def _terminate(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        # once per process: a second SIGTERM makes inferd serve stop without finishing its drain
        with self._lock:
            signalled, self._signalled = self._signalled is process, process
        if not signalled:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                os.killpg(process.pid, signal.SIGCONT)  # a stopped (hung) engine must run to see SIGTERM
            except ProcessLookupError:
                return
        try:
            process.wait(self.config.stop_timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("engine did not stop within %.0f s; killing it", self.config.stop_timeout_s)
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


def _describe_exit(returncode: int | None, last_line: str | None) -> str:
    """What a start-up failure is compared by: the last stderr line (for a signal, which
    signal too), else the exit status."""
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}" + (f" after: {last_line}" if last_line else "")
    return last_line or f"exit status {returncode}"


class EngineCollector:
    """inferd_engine_up (the engine is ready), its readiness state and restart counts."""

    name = "engine"

    def __init__(self, supervisor: Supervisor | None):
        self.supervisor = supervisor

    def collect(self) -> Iterable[Metric]:
        supervisor = self.supervisor
        if supervisor is None:
            # --no-engine: nothing supervised, so no series. A 0 would read as "engine down"
            # and fire InferdEngineDown beside an engine that runs elsewhere and is up.
            return
        up = GaugeMetricFamily(
            "inferd_engine_up",
            "1 while the supervised engine is ready: its process runs and its last readiness probe "
            "answered ready (without a probe: while its process runs), else 0",
        )
        restarts = CounterMetricFamily(
            "inferd_engine_restarts", "Times the agent started the engine again after it exited"
        )
        stall_restarts = CounterMetricFamily(
            "inferd_engine_stall_restarts",
            "Restarts the agent made because the engine's readiness probe said stalled or dead, "
            "or got no answer after the engine had been ready, for longer than the stall bound",
        )
        up.add_metric([], 1.0 if supervisor.is_ready else 0.0)
        restarts.add_metric([], float(supervisor.restarts))
        stall_restarts.add_metric([], float(supervisor.stall_restarts))
        yield up
        yield restarts
        yield stall_restarts
        if supervisor.config.ready_url is not None:
            state = GaugeMetricFamily(
                "inferd_engine_ready_state",
                "1 for the engine's current readiness state, 0 for the others",
                labels=["state"],
            )
            current = supervisor.readiness
            for name in READINESS_STATES:
                state.add_metric([name], 1.0 if name == current else 0.0)
            yield state
            yield GaugeMetricFamily(
                "inferd_engine_loading_seconds",
                "How long the engine has said it is loading (0 when it is not): the "
                "InferdEngineDown alert waits for a load up to its timeout",
                value=supervisor.loading_seconds,
            )


# -- the launcher: `python -m inferd.agent.supervisor --cpus 0,1 --membind 0 -- CMD ...` --


def set_membind(node: int) -> None:
    """set_mempolicy(MPOL_BIND, {node}) for this process; raises OSError with the reason."""
    number = SYS_SET_MEMPOLICY.get(platform.machine())
    if number is None:
        raise OSError(f"set_mempolicy syscall number unknown on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    words = node // 64 + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // 64] = 1 << (node % 64)
    if libc.syscall(number, MPOL_BIND, mask, ctypes.c_ulong(words * 64 + 1)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"set_mempolicy(MPOL_BIND, node {node}): {os.strerror(err)}")


def launcher_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferd.agent.supervisor", description="bind, then exec a command")
    parser.add_argument("--cpus", help="comma-separated CPU ids")
    parser.add_argument("--membind", type=int, help="NUMA node for MPOL_BIND")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given after --")
    if args.cpus:
        wanted = {int(c) for c in args.cpus.split(",")}
        usable = wanted & os.sched_getaffinity(0)
        if usable:
            os.sched_setaffinity(0, usable)
        else:
            print(f"agent.supervisor: CPUs {args.cpus} not available here; CPU affinity not set", file=sys.stderr)
    if args.membind is not None:
        try:
            set_membind(args.membind)
        except OSError as exc:
            print(f"agent.supervisor: memory policy not set, running with CPU binding only: {exc}", file=sys.stderr)
    os.execvp(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(launcher_main())
