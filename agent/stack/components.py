"""What `up` starts: the agent (which supervises the engine), Prometheus and Alertmanager
with the very files compose.yaml mounts (prometheus/prometheus.yml, alerts/alertmanager.yml),
and Grafana where it is installed; one note per part of compose.yaml's stack it does not
start, with the reason and how to get it."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .config import REPO, StackConfig
from .endpoints import AGENT_URL, ALERTMANAGER_URL, ENGINE_URL, GRAFANA_URL, PROMETHEUS_URL
from .tokens import admin_token_path, webhook_config


@dataclass(frozen=True, slots=True)
class Component:
    name: str
    argv: tuple[str, ...]
    health_url: str
    url: str  # what the user opens
    ports: tuple[int, ...]
    env: tuple[tuple[str, str], ...] = ()
    extra_health_urls: tuple[str, ...] = field(default=())


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
