"""The run directory's `state.json`: the pid and process group of each component started,
the base URL of each endpoint and the model name clients send. `down` and `status` read
it; `inferd doctor` finds the stack there."""

from __future__ import annotations

import json
from pathlib import Path

from .components import Component
from .config import StackConfig
from .endpoints import AGENT_URL, ALERTMANAGER_URL, ENGINE_URL, GRAFANA_URL, PROMETHEUS_URL

STATE_FILE = "state.json"


def read_state(run_dir: Path) -> dict:
    path = run_dir / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else {"components": {}}


def write_state(run_dir: Path, state: dict) -> None:
    tmp = run_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(run_dir / STATE_FILE)


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
