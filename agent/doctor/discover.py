"""Where the doctor finds the agent, the engine and Prometheus when no flag names them:
the local stack's state (`inferd stack up` / `make run` write `.out/stack/state.json`),
else the stack's default ports, probed with a short timeout. Each endpoint comes with
where it was found, and each one not found with what was tried; the report prints both.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from inferd.agent import stack

NAMES = ("agent", "engine", "prometheus")
DEFAULTS = {"agent": stack.AGENT_URL, "engine": stack.ENGINE_URL, "prometheus": stack.PROMETHEUS_URL}
# what answers when the endpoint is there: the agent's /healthz is 503 while its engine is down
PROBES = {"agent": ("/healthz", (200, 503)), "engine": ("/v1/models", (200,)), "prometheus": ("/-/ready", (200,))}


@dataclass(frozen=True, slots=True)
class Found:
    urls: dict[str, str | None]  # name -> base URL, None when not found
    where: dict[str, str]  # name -> where it was found, or what was tried
    admin_token_file: str | None = None  # the stack's admin token, for an engine found in it


def probe(name: str, url: str, timeout_s: float) -> bool:
    path, statuses = PROBES[name]
    try:
        with urllib.request.urlopen(f"{url}{path}", timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError):
        return False
    return status in statuses


def running_stack(run_dir: Path) -> dict | None:
    """The stack's state when one of its processes still runs; None otherwise."""
    try:
        state = json.loads((run_dir / stack.STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    entries = state.get("components", {}).values() if isinstance(state, dict) else ()
    if not any(isinstance(e, dict) and stack.is_running(int(e.get("pid", 0) or 0)) for e in entries):
        return None
    return state


def stack_endpoints(state: dict) -> dict[str, str]:
    """Base URLs from a stack's state (state.json's `endpoints`; older states listed each
    component's URL only, and no engine)."""
    found = dict(state.get("endpoints") or {})
    for name, entry in state.get("components", {}).items():
        if name in NAMES and name not in found and isinstance(entry, dict) and entry.get("url"):
            url = str(entry["url"])
            found[name] = url.removesuffix("/metrics")
    return {n: str(u).rstrip("/") for n, u in found.items() if n in NAMES}


def find(
    given: dict[str, str | None],
    run_dir: Path = stack.DEFAULT_RUN_DIR,
    timeout_s: float = 0.5,
    admin_token: bool = True,
) -> Found:
    """Each endpoint: the flag's URL when given; else the running stack's (from its state
    under `run_dir`); else the default port when something there answers like it."""
    urls: dict[str, str | None] = {}
    where: dict[str, str] = {}
    state = running_stack(run_dir)
    from_state = stack_endpoints(state) if state is not None else {}
    state_file = run_dir / stack.STATE_FILE
    token = None
    for name in NAMES:
        if given.get(name):
            urls[name], where[name] = given[name], f"--{name}"
        elif name in from_state:
            urls[name], where[name] = from_state[name], f"the running stack's {state_file}"
        elif probe(name, DEFAULTS[name], timeout_s):
            urls[name], where[name] = DEFAULTS[name], f"the default port: {DEFAULTS[name]} answered"
        else:
            looked = f"no running stack in {run_dir}" if state is None else f"{state_file} lists no {name}"
            urls[name] = None
            where[name] = f"no {name} found: no --{name}, {looked}, nothing answered at {DEFAULTS[name]}"
    if admin_token and urls["engine"] and not given.get("engine"):
        path = stack.admin_token_path(run_dir)
        if path.is_file():
            token = str(path)
    return Found(urls, where, token)
