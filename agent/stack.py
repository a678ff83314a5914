"""`inferd stack up|down|status|token`: the compose stack without Docker.

Starts the distribution's `prometheus` and `prometheus-alertmanager` with the very files
compose.yaml mounts (prometheus/prometheus.yml, alerts/alertmanager.yml), the agent
(which supervises the engine), and Grafana where it is installed; waits until each
answers its health URL, prints the URLs, one line per part it did not start with the
reason (Grafana not installed, the OpenTelemetry Collector, which it never starts),
and returns. `down` stops them.

State lives in a run directory (default `.out/stack` in the repository): `state.json`
(pid and process group of each component, the base URL of each endpoint, the model name
clients send; `inferd doctor` finds the stack there), one log per component, Prometheus' and
Alertmanager's data, and `admin-token` (mode 0600), the engine's admin bearer token,
made on the first `up` and handed to the agent with --admin-token-file; `token` prints
it. Every process started gets `INFERD_STACK_RUN_DIR` in its environment, so `down`
also finds descendants that left their process group (the engine the agent starts)
and nothing is left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MARKER = "INFERD_STACK_RUN_DIR"
STATE_FILE = "state.json"
ADMIN_TOKEN_FILE = "admin-token"
DEFAULT_RUN_DIR = REPO / ".out" / "stack"

# The stack's endpoints (base URLs): fixed ports, as compose.yaml has them.
AGENT_URL = "http://localhost:10400"
ENGINE_URL = "http://localhost:8000"
PROMETHEUS_URL = "http://localhost:9090"
ALERTMANAGER_URL = "http://localhost:9093"
GRAFANA_URL = "http://localhost:3000"


@dataclass(frozen=True, slots=True)
class Component:
    name: str
    argv: tuple[str, ...]
    health_url: str
    url: str  # what the user opens
    ports: tuple[int, ...]
    env: tuple[tuple[str, str], ...] = ()
    extra_health_urls: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class StackConfig:
    run_dir: Path
    timeout_s: float = 120.0
    agent_args: tuple[str, ...] = ()
    with_grafana: bool = True
    model: Path | None = None  # the engine's checkpoint; None = the agent runs without an engine

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout must be positive, got {self.timeout_s}")


def token_file() -> Path:
    """The bearer-token file alerts/alertmanager.yml sends to the agent's webhook."""
    text = (REPO / "alerts" / "alertmanager.yml").read_text()
    match = re.search(r"credentials_file:\s*(\S+)", text)
    if match is None:
        raise RuntimeError("alerts/alertmanager.yml names no credentials_file for the agent's webhook")
    path = Path(match.group(1))
    return path if path.is_absolute() else REPO / "alerts" / path


def ensure_token(
    path: Path, what: str = "the webhook token", named_in: str = " (named in alerts/alertmanager.yml)"
) -> None:
    """Create `path` holding a fresh random token, mode 0600, unless it exists."""
    if path.exists():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except PermissionError as exc:
        raise RuntimeError(
            f"cannot create {what} {path}{named_in}: {exc}; run once as root or create it yourself"
        ) from exc
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))


def _usable(path: Path) -> bool:
    """The file can be read, or created by us (its nearest existing folder is writable)."""
    if path.exists():
        return os.access(path, os.R_OK)
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    return os.access(folder, os.W_OK)


def webhook_config(run_dir: Path) -> tuple[Path, Path]:
    """(webhook token file, Alertmanager config) for the stack. The token
    alerts/alertmanager.yml names (/etc/inferd/webhook-token, shared with compose.yaml)
    when this user may use it; otherwise a token under the run directory and a copy of the
    config naming it, so the stack also runs as a user who may not write /etc."""
    shared = token_file()
    config = REPO / "alerts" / "alertmanager.yml"
    if _usable(shared):
        return shared, config
    token, local = run_dir / "webhook-token", run_dir / "alertmanager.yml"
    text = re.sub(r"(credentials_file:\s*)\S+", lambda m: m.group(1) + str(token), config.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    local.write_text(text)
    return token, local


def admin_token_path(run_dir: Path) -> Path:
    """The engine's admin token under the stack's run directory (made by `up`)."""
    return run_dir / ADMIN_TOKEN_FILE


def inferd_command() -> str:
    """How the user runs inferd from where they are: `inferd` when it is on PATH, else the
    virtual environment's script (relative to the working directory when below it)."""
    if shutil.which("inferd"):
        return "inferd"
    script = Path(sys.executable).parent / "inferd"
    if not script.exists():
        return f"{sys.executable} -m inferd.agent.cli"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def stop_hint(run_dir: Path) -> str:
    """The command that stops this stack, as the user can type it."""
    command = f"{inferd_command()} stack down"
    if run_dir.resolve() != DEFAULT_RUN_DIR.resolve():
        return f"`{command} --run-dir {run_dir}`"
    in_repo = Path.cwd().resolve() == REPO.resolve()
    return f"`make stop` (or `{command}`)" if in_repo else f"`{command}`"


def find_binary(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def components(config: StackConfig) -> tuple[list[Component], list[str]]:
    """The components to start, and one note per part of compose.yaml's stack not
    started, with the reason and how to get it."""
    notes: list[str] = []
    run = config.run_dir
    prometheus = find_binary("prometheus")
    alertmanager = find_binary("prometheus-alertmanager", "alertmanager")
    if prometheus is None or alertmanager is None:
        missing = [n for n, b in (("prometheus", prometheus), ("prometheus-alertmanager", alertmanager)) if b is None]
        raise RuntimeError(
            f"not installed: {', '.join(missing)} (apt-get install {' '.join(missing)}; scripts/setup.sh does)"
        )
    token, alertmanager_config = webhook_config(run)
    engine: tuple[str, ...]
    if config.model:
        engine = ("--model", str(config.model), "--admin-token-file", str(admin_token_path(run)))
    else:
        engine = ("--no-engine",)
        notes.append(skipped("engine", "--no-engine given; the agent only collects and exports"))
    out = [
        Component(
            "agent",
            (
                sys.executable,
                "-m",
                "inferd.agent.cli",
                "agent",
                *engine,
                "--webhook-token-file",
                str(token),
                *config.agent_args,
            ),
            f"{AGENT_URL}/healthz",
            f"{AGENT_URL}/metrics",
            (10400, 8000) if config.model else (10400,),
            extra_health_urls=(f"{ENGINE_URL}/ready",) if config.model else (),
        ),
        Component(
            "prometheus",
            (
                prometheus,
                f"--config.file={REPO / 'prometheus' / 'prometheus.yml'}",
                f"--storage.tsdb.path={run / 'prometheus-data'}",
                "--web.listen-address=127.0.0.1:9090",
            ),
            f"{PROMETHEUS_URL}/-/ready",
            PROMETHEUS_URL,
            (9090,),
        ),
        Component(
            "alertmanager",
            (
                alertmanager,
                f"--config.file={alertmanager_config}",
                f"--storage.path={run / 'alertmanager-data'}",
                "--web.listen-address=127.0.0.1:9093",
                "--cluster.listen-address=",
            ),
            f"{ALERTMANAGER_URL}/-/ready",
            ALERTMANAGER_URL,
            (9093,),
        ),
    ]
    grafana = find_binary("grafana", "grafana-server") if config.with_grafana else None
    if not config.with_grafana:
        notes.append(skipped("grafana", "--no-grafana given"))
    elif grafana is None:
        notes.append(
            skipped(
                "grafana",
                "not installed (Grafana's own package, or `docker compose up grafana`, serves "
                "dashboards/generated on :3000 from this Prometheus)",
            )
        )
    else:
        home = next((p for p in ("/usr/share/grafana", "/usr/local/share/grafana") if Path(p).is_dir()), None)
        argv = [grafana] + (["server"] if Path(grafana).name == "grafana" else [])
        if home:
            argv.append(f"--homepath={home}")
        out.append(
            Component(
                "grafana",
                tuple(argv),
                f"{GRAFANA_URL}/api/health",
                GRAFANA_URL,
                (3000,),
                env=(
                    ("GF_PATHS_PROVISIONING", str(REPO / "dashboards" / "provisioning")),
                    ("GF_PATHS_DATA", str(run / "grafana-data")),
                    ("GF_PATHS_LOGS", str(run / "grafana-data" / "log")),
                    ("GF_PATHS_PLUGINS", str(run / "grafana-data" / "plugins")),
                    ("GF_SERVER_HTTP_ADDR", "127.0.0.1"),
                    ("GF_SERVER_HTTP_PORT", "3000"),
                    ("GF_AUTH_ANONYMOUS_ENABLED", "true"),
                    ("GF_AUTH_ANONYMOUS_ORG_ROLE", "Viewer"),
                    ("INFERD_DASHBOARDS_DIR", str(REPO / "dashboards" / "generated")),
                ),
            )
        )
    notes.append(
        skipped(
            "otel-collector",
            "`inferd stack` never starts it (`docker compose up otel-collector`, or "
            "otelcol-contrib --config=otel/collector.yaml; then up with --agent-arg=--otlp-endpoint=http://localhost:4318)",
        )
    )
    return out, notes


def skipped(name: str, reason: str) -> str:
    return f"{name:<14} not started: {reason}"


# --- processes -------------------------------------------------------------------------


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


def answers(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def served_model(engine_url: str, timeout_s: float = 2.0) -> str | None:
    """The model name clients send (`"model": ...`): the first id the engine's /v1/models
    lists; None when it does not answer."""
    try:
        with urllib.request.urlopen(f"{engine_url.rstrip('/')}/v1/models", timeout=timeout_s) as response:
            return str(json.load(response)["data"][0]["id"])
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def engine_summary(engine_url: str, name: str | None, checkpoint: Path | None) -> str:
    """The start-up line for the engine: where clients send requests and the model name
    they send (`served_model`), which is not the checkpoint's path."""
    model = f'send "model": "{name}"' if name else "its /v1/models did not answer"
    weights = f"; checkpoint {checkpoint}" if checkpoint else ""
    return f"{'engine':<14} {engine_url}/v1 (OpenAI API: {model}{weights})"


def endpoints(config: StackConfig, started: list[Component]) -> dict[str, str]:
    """Base URL of each endpoint the stack serves, by name (state.json's `endpoints`)."""
    names = {c.name for c in started}
    known = {
        "agent": AGENT_URL,
        "engine": ENGINE_URL if config.model else None,
        "prometheus": PROMETHEUS_URL,
        "alertmanager": ALERTMANAGER_URL,
        "grafana": GRAFANA_URL,
    }
    return {n: url for n, url in known.items() if url and (n in names or n == "engine")}


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


# --- state -----------------------------------------------------------------------------


def read_state(run_dir: Path) -> dict:
    path = run_dir / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else {"components": {}}


def write_state(run_dir: Path, state: dict) -> None:
    tmp = run_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(run_dir / STATE_FILE)


# --- up / down -------------------------------------------------------------------------


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


def up(config: StackConfig) -> int:
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    if marked_pids(run_dir):
        print(f"inferd stack: already running from {run_dir}; stop it first with {stop_hint(run_dir)}", file=sys.stderr)
        return 1
    try:
        wanted, notes = components(config)
        ensure_token(webhook_config(run_dir)[0])
        if config.model:
            ensure_token(admin_token_path(run_dir), "the engine's admin token", "")
    except RuntimeError as exc:
        print(f"inferd stack: {exc}", file=sys.stderr)
        return 1
    busy = [f"{c.name} port {p}" for c in wanted for p in c.ports if port_in_use(p)]
    if busy:
        print(f"inferd stack: ports already in use: {', '.join(busy)}", file=sys.stderr)
        return 1
    state: dict[str, Any] = {"repo": str(REPO), "components": {}}
    deadline = time.monotonic() + config.timeout_s
    try:
        for component in wanted:
            process = start(component, run_dir)
            state["components"][component.name] = {"pid": process.pid, "pgid": process.pid, "url": component.url}
            write_state(run_dir, state)
            wait_healthy(component, process, deadline, run_dir)
            print(f"{component.name:<14} {component.url}", flush=True)
    except (RuntimeError, OSError) as exc:
        print(f"inferd stack: {exc}\nstopping what was started", file=sys.stderr)
        down(config)
        return 1
    state["endpoints"] = endpoints(config, wanted)
    state["model"] = served_model(ENGINE_URL) if config.model else None
    write_state(run_dir, state)
    if config.model:
        print(engine_summary(ENGINE_URL, state["model"], config.model))
        print(
            f"{'admin token':<14} {admin_token_path(run_dir)} (bearer token of /admin/* on :8000; "
            f"`{inferd_command()} stack token` prints it)"
        )
    for note in notes:
        print(note)
    print(f"logs and state in {run_dir}; stop with {stop_hint(run_dir)}")
    return 0


def down(config: StackConfig) -> int:
    run_dir = config.run_dir
    state = read_state(run_dir)
    entries = list(state["components"].items())[::-1]  # reverse start order: the agent last
    pgids = [e["pgid"] for _, e in entries]
    pids = sorted({e["pid"] for _, e in entries} | set(marked_pids(run_dir)))
    if not pids:
        print("inferd stack: nothing running")
    survivors = terminate(pids, pgids, config.timeout_s)
    survivors += [p for p in marked_pids(run_dir) if p not in survivors]
    if survivors:
        print(f"inferd stack: processes still running after SIGKILL: {survivors}", file=sys.stderr)
        return 1
    (run_dir / STATE_FILE).unlink(missing_ok=True)
    for name, _ in entries:
        print(f"{name:<14} stopped")
    return 0


def status(config: StackConfig) -> int:
    state = read_state(config.run_dir)
    if not state["components"]:
        print("inferd stack: not running")
        return 1
    healthy = True
    for name, entry in state["components"].items():
        alive = is_running(entry["pid"])
        healthy &= alive
        print(f"{name:<14} {'up' if alive else 'DOWN':<5} pid {entry['pid']:<8} {entry['url']}")
        if name == "agent" and "engine" in state.get("endpoints", {}):
            healthy &= print_engine(config.run_dir, state, entry["pid"])
    return 0 if healthy else 1


def print_engine(run_dir: Path, state: dict, agent_pid: int) -> bool:
    """The engine's status line (the agent runs it, so it has no state entry of its own):
    up when it answers /ready; its pid, the served model name clients send."""
    url = state["endpoints"]["engine"]
    alive = answers(f"{url}/ready")
    pid = engine_pid(run_dir, agent_pid)
    name = served_model(url) if alive else state.get("model")
    model = f' (send "model": "{name}")' if name else ""
    print(f"{'engine':<14} {'up' if alive else 'DOWN':<5} pid {pid or '-':<8} {url}/v1{model}")
    return alive


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


def token(config: StackConfig) -> int:
    """Print the engine's admin token (for `Authorization: Bearer $(inferd stack token)`)."""
    path = admin_token_path(config.run_dir)
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        print(f"inferd stack: no admin token at {path}; `{inferd_command()} stack up` makes it", file=sys.stderr)
        return 1
    print(text)
    return 0


def default_model() -> Path:
    """The engine's embedded default model, written once under the user's cache folder."""
    from inferd.engine.server.cli import default_model_dir, ensure_default_model

    return ensure_default_model(default_model_dir())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=("up", "down", "status", "token", "default-model"),
        help="up: start and wait until healthy; down: stop everything; status: what runs; "
        "token: print the engine's admin token (in RUN_DIR/admin-token); "
        "default-model: write the embedded model if needed and print its directory (compose.yaml uses it)",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=DEFAULT_RUN_DIR,
        help="state, logs, data and the admin token (default: .out/stack in the repository)",
    )
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds to wait for health, and for processes to stop"
    )
    parser.add_argument("--no-grafana", action="store_true", help="do not start Grafana even where installed")
    parser.add_argument("--model", type=Path, help="engine checkpoint (default: the embedded default model)")
    parser.add_argument("--no-engine", action="store_true", help="run the agent without an engine")
    parser.add_argument(
        "--agent-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `inferd agent` (repeat), e.g. --agent-arg=--gpu-backend=replay:PATH",
    )


def run(args: argparse.Namespace) -> int:
    if args.action == "default-model":
        print(default_model())
        return 0
    model = None
    if args.action == "up" and not args.no_engine:
        model = args.model.resolve() if args.model else default_model()
    config = StackConfig(
        run_dir=args.run_dir.resolve(),
        timeout_s=args.timeout,
        agent_args=tuple(args.agent_arg),
        with_grafana=not args.no_grafana,
        model=model,
    )
    return {"up": up, "down": down, "status": status, "token": token}[args.action](config)
