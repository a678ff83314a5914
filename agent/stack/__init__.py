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

    config      StackConfig, the repository and the default run directory
    endpoints   the fixed base URLs; whether one answers; the model the engine serves
    tokens      the webhook token and the engine's admin token
    components  what `up` starts, and a note for each part it does not
    processes   starting, finding (by the marker), waiting on and stopping processes
    state       state.json
    commands    up, down, status, token; the command line (`add_arguments`, `run`)
"""

from .commands import add_arguments, down, engine_summary, inferd_command, run, status, stop_hint, token, up
from .components import Component, components, find_binary
from .config import DEFAULT_RUN_DIR, REPO, StackConfig
from .endpoints import AGENT_URL, ALERTMANAGER_URL, ENGINE_URL, GRAFANA_URL, PROMETHEUS_URL, served_model
from .processes import MARKER, is_running, marked_pids, port_in_use
from .state import STATE_FILE, write_state
from .tokens import ADMIN_TOKEN_FILE, admin_token_path, ensure_token, token_file

__all__ = [
    "ADMIN_TOKEN_FILE",
    "AGENT_URL",
    "ALERTMANAGER_URL",
    "DEFAULT_RUN_DIR",
    "ENGINE_URL",
    "GRAFANA_URL",
    "MARKER",
    "PROMETHEUS_URL",
    "REPO",
    "STATE_FILE",
    "Component",
    "StackConfig",
    "add_arguments",
    "admin_token_path",
    "components",
    "down",
    "engine_summary",
    "ensure_token",
    "find_binary",
    "inferd_command",
    "is_running",
    "marked_pids",
    "port_in_use",
    "run",
    "served_model",
    "status",
    "stop_hint",
    "token",
    "token_file",
    "up",
    "write_state",
]
