"""The real closed loop on loopback, for scenario runs and end-to-end tests.

The distribution's Prometheus and Alertmanager run the repository's own rules and
Alertmanager config (every duration scaled through `alerts/render.py --time-scale`, see
alerts/README.md), Prometheus scrapes the agent and the engine, and a real agent
supervises a real engine: all on free loopback ports, everything under one run
directory (configs, one log per process, Prometheus' and Alertmanager's data, the audit
log).

`acting=False` is the same stack minus acting: the agent runs with `--dry-run`, so the
alerts still fire, Alertmanager still calls the agent and every decision is still in
the audit log (result `dry_run`), but the engine is never touched. That is "the default
configuration without the agent" of a scenario, with nothing else changed.

`supervision="restart_on_exit"` takes the engine from the agent too: the stack runs
`inferd serve` itself and starts it again 1 s after it exits, as a container runtime's
restart policy or systemd's Restart=always would, and nothing watches its readiness
(the agent runs with --no-engine, in dry run). That is the default for the scenarios
where the engine dies or hangs: what a node has without inferd's supervisor.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from inferd.agent.stack import find_binary

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
ADMIN_TOKEN = "scenario-admin-token"
WEBHOOK_TOKEN = "scenario-webhook-token"
SUPERVISION = ("agent", "restart_on_exit")
RESTART_ON_EXIT_DELAY_S = 1.0
PRODUCTION_STALL_RESTART_S = 30.0  # the agent's --engine-stall-restart-after default
# The supervisor probes /ready every 2 s with a 2 s timeout: fewer than three probes would
# let one slow answer on a loaded 2-core machine restart a healthy engine.
MIN_STALL_RESTART_S = 6.0
PRODUCTION_SCRAPE_S = 5.0  # prometheus/prometheus.yml: scrape and evaluation interval
MIN_SCRAPE_S = 1.0  # a CPU pays for every scrape; 2m at 1/30 is 4 s, four samples
SERVED_MODEL = "tiny"

T = TypeVar("T")


class MissingBinary(RuntimeError):
    """Prometheus or Alertmanager is not installed."""


def binary(*names: str) -> str:
    path = find_binary(*names)
    if path is None:
        raise MissingBinary(f"{names[0]} not installed (Debian packages prometheus and prometheus-alertmanager)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(
    predicate: Callable[[], T], timeout: float, what: str, stack: Stack | None = None, interval: float = 0.5
) -> T:
    """Poll `predicate` until it returns something true and return that; TimeoutError
    (with the stack's log tails) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (httpx.HTTPError, OSError, KeyError, ValueError) as exc:
            last_exc = exc
        time.sleep(interval)
    logs = stack.log_tails() if stack else ""
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last_exc})\n{logs}")


def make_preset_model(out: Path, preset: str = "tiny") -> Path:
    """A random checkpoint of a make-model preset (`inferd make-model --preset P`), unless
    `out` has one."""
    if not (out / "config.json").exists():
        subprocess.run(
            [PY, "-m", "inferd.agent.cli", "make-model", str(out), "--preset", preset],
            check=True,
            cwd=ROOT,
            capture_output=True,
        )
    return out


def make_tiny_model(out: Path) -> Path:
    return make_preset_model(out, "tiny")


def scrape_interval(time_scale: float) -> float:
    """Prometheus' scrape and evaluation interval at this time scale: production's,
    scaled, but never under MIN_SCRAPE_S."""
    return max(MIN_SCRAPE_S, PRODUCTION_SCRAPE_S * time_scale)


class Stack:
    """Prometheus, Alertmanager and the agent (which runs the engine), on free ports.

    `policy`: the agent's remediation settings (agent/remediation_rules.py PolicyConfig),
    written as given: scale its durations yourself. `engine_args`: `inferd serve`
    options. `acting=False`: the agent only records what it would do (--dry-run)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        time_scale: float,
        engine_args: Sequence[str],
        policy: Mapping[str, Any],
        acting: bool = True,
        supervision: str = "agent",
        stall_restart_after_s: float | None = None,
        alert_params: Mapping[str, str] | None = None,
        scrape_interval_s: float | None = None,
        gpu_metrics: bool = False,
        admin_token: str = ADMIN_TOKEN,
        webhook_token: str = WEBHOOK_TOKEN,
    ):
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
        if supervision not in SUPERVISION:
            raise ValueError(f"supervision must be one of {', '.join(SUPERVISION)}, got {supervision!r}")
        self.tmp = run_dir
        self.supervision = supervision
        # SECTION.KEY -> value over alerts/params.yml (render.py --set), before the time scale
        self.alert_params = dict(alert_params or {})
        # Scaled like every other duration; `inf` turns the supervisor's stall restarts off.
        self.stall_restart_after_s = stall_restart_after_s or max(
            MIN_STALL_RESTART_S, PRODUCTION_STALL_RESTART_S * time_scale
        )
        self.time_scale = time_scale
        self.engine_args = list(engine_args)
        self.policy = dict(policy)
        self.acting = acting
        self.scrape_interval_s = scrape_interval_s or scrape_interval(time_scale)
        self.gpu_metrics = gpu_metrics
        self.admin_token = admin_token
        self.webhook_token = webhook_token
        self.ports = {name: free_port() for name in ("engine", "agent", "prometheus", "alertmanager")}
        self.procs: dict[str, subprocess.Popen] = {}
        self.engine_starts = 0  # restart_on_exit: how many times the stack started the engine
        self._stopping = threading.Event()
        self._restarter: threading.Thread | None = None
        self.audit = run_dir / "audit.jsonl"
        self.http = httpx.Client(timeout=10)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    # -- set-up --

    def write_configs(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        (self.tmp / "webhook-token").write_text(self.webhook_token)
        alerts = self.tmp / "alerts"
        subprocess.run(
            [
                PY,
                str(ROOT / "alerts" / "render.py"),
                "--out",
                str(alerts),
                "--time-scale",
                str(self.time_scale),
                "--set",
                f"alertmanager.webhook_url={self.url('agent')}/v1/alerts",
                "--set",
                f"alertmanager.token_file={self.tmp / 'webhook-token'}",
                *(arg for key, value in self.alert_params.items() for arg in ("--set", f"{key}={value}")),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        host_label = [
            {"source_labels": ["__address__"], "regex": "(.+):[0-9]+", "target_label": "host", "replacement": "$1"}
        ]
        interval = self.scrape_interval_s
        prometheus = {
            "global": {
                "scrape_interval": f"{round(interval * 1000):d}ms",  # Prometheus takes no fractions
                "scrape_timeout": f"{round(interval * 900):d}ms",
                "evaluation_interval": f"{round(interval * 1000):d}ms",
            },
            "rule_files": [str(alerts / "rules.yml")],
            "alerting": {
                "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{self.ports['alertmanager']}"]}]}]
            },
            "scrape_configs": [
                {
                    "job_name": job,
                    "static_configs": [{"targets": [f"127.0.0.1:{self.ports[name]}"]}],
                    "relabel_configs": host_label,
                }
                for job, name in (("inferd-agent", "agent"), ("inferd-engine", "engine"))
            ],
        }
        (self.tmp / "prometheus.yml").write_text(yaml.safe_dump(prometheus))
        (self.tmp / "policy.yml").write_text(yaml.safe_dump(self.policy))

    def agent_argv(self, model: Path) -> list[str]:
        argv = [
            PY,
            "-m",
            "inferd.agent.cli",
            "agent",
            "--model",
            str(model),
            "--port",
            str(self.ports["agent"]),
            "--engine-port",
            str(self.ports["engine"]),
            *(() if self.gpu_metrics else ("--no-collector", "gpu")),
            "--no-collector",
            "ebpf",
            "--webhook-token-file",
            str(self.tmp / "webhook-token"),
            "--audit-log",
            str(self.audit),
            "--prometheus-url",
            self.url("prometheus"),
            "--remediation-config",
            str(self.tmp / "policy.yml"),
        ]
        if self.supervision == "restart_on_exit":
            return argv + ["--no-engine", "--dry-run"]
        argv.append(f"--engine-stall-restart-after={self.stall_restart_after_s}")
        if not self.acting:
            argv.append("--dry-run")
        return argv + [f"--engine-arg={arg}" for arg in self.engine_args]

    def engine_argv(self, model: Path) -> list[str]:
        """`inferd serve` as the agent would run it (agent/main.py engine_command)."""
        return [
            PY,
            "-m",
            "inferd.agent.cli",
            "serve",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.ports["engine"]),
            *self.engine_args,
        ]

    def start(self, model: Path) -> None:
        prometheus = binary("prometheus")
        alertmanager = binary("prometheus-alertmanager", "alertmanager")
        self.write_configs()
        self._spawn(
            "prometheus",
            [
                prometheus,
                f"--config.file={self.tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.tmp / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{self.ports['prometheus']}",
                "--rules.alert.resend-delay=1s",
                "--log.level=warn",
            ],
        )
        self._spawn(
            "alertmanager",
            [
                alertmanager,
                f"--config.file={self.tmp / 'alerts' / 'alertmanager.yml'}",
                f"--storage.path={self.tmp / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{self.ports['alertmanager']}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
        )
        env = {**os.environ, "INFERD_ADMIN_TOKEN": self.admin_token, "PYTHONPATH": str(ROOT)}
        self._spawn("agent", self.agent_argv(model), env=env)
        if self.supervision == "restart_on_exit":
            self._spawn("engine", self.engine_argv(model), env=env)
            self.engine_starts = 1
            self._restarter = threading.Thread(target=self._restart_on_exit, args=(model, env), daemon=True)
            self._restarter.start()
        wait_for(
            lambda: self.http.get(f"{self.url('prometheus')}/-/ready").status_code == 200, 60, "prometheus ready", self
        )
        wait_for(
            lambda: self.http.get(f"{self.url('alertmanager')}/-/ready").status_code == 200,
            60,
            "alertmanager ready",
            self,
        )
        wait_for(lambda: self.http.get(f"{self.url('engine')}/ready").status_code == 200, 120, "engine ready", self)

    def _restart_on_exit(self, model: Path, env: dict) -> None:
        while not self._stopping.is_set():
            proc = self.procs["engine"]
            if proc.poll() is None:
                self._stopping.wait(0.2)
                continue
            if self._stopping.wait(RESTART_ON_EXIT_DELAY_S):
                return
            self._spawn("engine", self.engine_argv(model), env=env)
            self.engine_starts += 1

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> None:
        with open(self.tmp / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True
            )

    def stop(self) -> None:
        self._stopping.set()
        if self._restarter is not None:
            self._restarter.join()
        engine_pid = self.engine_pid()
        for name in ("agent", "alertmanager", "prometheus"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if engine_pid:
            try:
                os.kill(engine_pid, 0)
            except ProcessLookupError:
                pass
            else:
                os.killpg(engine_pid, signal.SIGKILL)  # the agent failed to stop its engine, or the stack runs it
        self.http.close()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tails(self, lines: int = 25) -> str:
        out = []
        for path in sorted(self.tmp.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(out)

    # -- reading the state --

    def engine_pid(self) -> int | None:
        if self.supervision == "restart_on_exit":
            proc = self.procs.get("engine")
            return proc.pid if proc is not None and proc.poll() is None else None
        try:
            return self.http.get(f"{self.url('agent')}/healthz").json()["engine"]["pid"]
        except (httpx.HTTPError, KeyError, TypeError, ValueError):
            return None

    def engine_restarts(self) -> int | None:
        """Times the engine was started again: by the stack (restart_on_exit) or the agent's supervisor."""
        if self.supervision == "restart_on_exit":
            return max(0, self.engine_starts - 1)
        try:
            return int(self.http.get(f"{self.url('agent')}/healthz").json()["engine"]["restarts"])
        except (httpx.HTTPError, KeyError, TypeError, ValueError):
            return None

    def records(self) -> list[dict]:
        """The agent's audit log, oldest first."""
        return self.http.get(f"{self.url('agent')}/v1/actions", params={"limit": 0}).json()["records"]

    def find(self, since: float = 0.0, **match: Any) -> dict | None:
        """The first audit record at or after `since` (Unix time) with these fields."""
        for record in self.records():
            if record["ts"] >= since and all(record.get(k) == v for k, v in match.items()):
                return record
        return None

    def engine_config(self) -> dict:
        response = self.http.get(f"{self.url('engine')}/admin/config", headers=self.admin_headers)
        return response.json()["config"]

    def query(self, promql: str) -> float | None:
        body = self.http.get(f"{self.url('prometheus')}/api/v1/query", params={"query": promql}).json()
        result = body["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def firing(self, alertname: str) -> bool:
        alerts = self.http.get(f"{self.url('prometheus')}/api/v1/alerts").json()["data"]["alerts"]
        return any(a["labels"]["alertname"] == alertname and a["state"] == "firing" for a in alerts)
