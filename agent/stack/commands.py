"""The `inferd stack` actions: `up` starts the components and waits until each answers its
health URL, printing the URLs and a note per part not started; `down` stops everything the
run directory's marker finds; `status` says what runs; `token` prints the engine's admin
token; `default-model` writes the embedded model. Each returns the exit status."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from .components import components
from .config import DEFAULT_RUN_DIR, REPO, StackConfig
from .endpoints import ENGINE_URL, answers, served_model
from .processes import engine_pid, is_running, marked_pids, port_in_use, start, terminate, wait_healthy
from .state import STATE_FILE, endpoints, read_state, write_state
from .tokens import admin_token_path, ensure_token, webhook_config


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


# --- what the user reads ----------------------------------------------------------------


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


def engine_summary(engine_url: str, name: str | None, checkpoint: Path | None) -> str:
    """The start-up line for the engine: where clients send requests and the model name
    they send (`served_model`), which is not the checkpoint's path."""
    model = f'send "model": "{name}"' if name else "its /v1/models did not answer"
    weights = f"; checkpoint {checkpoint}" if checkpoint else ""
    return f"{'engine':<14} {engine_url}/v1 (OpenAI API: {model}{weights})"
