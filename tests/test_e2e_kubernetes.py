"""End to end, Kubernetes mode, on loopback: two nodes' agents, two engines, one alert.

Real processes: the distribution's Prometheus and Alertmanager with the repository's rules
(time-scaled by alerts/render.py, as tests/test_e2e_remediation.py does), two `inferd
serve` engines on the tiny model standing for the engine pods of nodes gpu-node-a and
gpu-node-b, and two `inferd agent --kubernetes` processes with those node names. The API
server is the replay of tests/kubernetes_replay.py (no cluster runs here): it lists each
node's recorded engine pod, its address rewritten to that engine. Prometheus labels each
target with its node as `host`, the way the ServiceMonitors do.

Two Alertmanagers stand for an HA pair: both hold every alert, and each agent pulls from
both. Their one webhook goes to node b's agent (a Service sends a notification to any
agent): it must leave node a's alert alone. A thrashing load on node a's engine fires
InferdKVCacheThrashing about gpu-node-a; node a's agent, pulling its node's alerts, acts
once (one routed alert, one applied step); node b's engine is never touched.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from kubernetes_replay import ReplayApiServer, fixture, point_at

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TIME_SCALE = 1 / 30  # 2m -> 4s
ADMIN_TOKEN = "e2e-admin-token"
WEBHOOK_TOKEN = "e2e-webhook-token"
NODES = ("gpu-node-a", "gpu-node-b")
# Two Alertmanagers holding the same alerts, as HA replicas do; not clustered, so each also
# sends its own notification to the webhook (a clustered pair would send one).
ALERTMANAGERS = ("alertmanager-1", "alertmanager-2")
# A KV pool of 24 blocks of 16 tokens: 16 sequences of 64 tokens need 64 (as in the other e2e test).
ENGINE_ARGS = ["--kv-cache-bytes=196608", "--max-num-seqs=16", "--served-model-name=tiny", "--log-level=WARNING"]
# One step and done: "acts once" is then exactly one applied record.
POLICY = {
    "max_num_seqs": {"minimum": 1, "maximum": 64, "max_step": 12},
    "step_fraction": 0.75,
    "cooldown_s": 600,
    "verify_window_s": 6,
    "max_episode_steps": 1,
    # As in tests/test_e2e_remediation.py: on the tiny CPU model any lower concurrency costs
    # throughput, so the guard could roll the step back before the test reads it.
    "guard_query": "",
}


def _binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(f"{names[0]} not installed (Debian packages prometheus and prometheus-alertmanager)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fleet:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.ports = {
            name: _free_port()
            for name in (
                "prometheus",
                *ALERTMANAGERS,
                *(f"engine-{n}" for n in NODES),
                *(f"agent-{n}" for n in NODES),
            )
        }
        self.procs: dict[str, subprocess.Popen] = {}
        self.http = httpx.Client(timeout=10)
        a_pod = fixture("pods-gpu-node-a.json")["items"][0]
        [b_pod] = fixture("pods-gpu-node-b.json")["items"]
        self.api = ReplayApiServer(
            {
                "gpu-node-a": [point_at(a_pod, self.ports["engine-gpu-node-a"])],
                "gpu-node-b": [point_at(b_pod, self.ports["engine-gpu-node-b"])],
            }
        )

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def start(self, model: Path) -> None:
        tmp = self.tmp
        (tmp / "webhook-token").write_text(WEBHOOK_TOKEN)
        (tmp / "admin-token").write_text(ADMIN_TOKEN)
        (tmp / "policy.yml").write_text(yaml.safe_dump(POLICY))
        kubeconfig = self.api.kubeconfig(tmp / "kubeconfig")
        subprocess.run(
            [
                PY,
                str(ROOT / "alerts" / "render.py"),
                "--out",
                str(tmp / "alerts"),
                "--time-scale",
                str(TIME_SCALE),
                "--set",  # the webhook reaches node b's agent, whatever the alert's node
                f"alertmanager.webhook_url={self.url('agent-gpu-node-b')}/v1/alerts",
                "--set",
                f"alertmanager.token_file={tmp / 'webhook-token'}",
            ],
            check=True,
            capture_output=True,
        )

        def targets(kind: str) -> list[dict]:
            return [{"targets": [f"127.0.0.1:{self.ports[f'{kind}-{n}']}"], "labels": {"host": n}} for n in NODES]

        prometheus = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(tmp / "alerts" / "rules.yml")],
            "alerting": {
                "alertmanagers": [
                    {"static_configs": [{"targets": [f"127.0.0.1:{self.ports[am]}" for am in ALERTMANAGERS]}]}
                ]
            },
            "scrape_configs": [
                {"job_name": "inferd-engine", "static_configs": targets("engine")},
                {"job_name": "inferd-agent", "static_configs": targets("agent"), "honor_labels": True},
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(prometheus))
        env = {**os.environ, "INFERD_ADMIN_TOKEN": ADMIN_TOKEN, "PYTHONPATH": str(ROOT)}
        for node in NODES:
            self._spawn(
                f"engine-{node}",
                [PY, "-m", "inferd.agent.cli", "serve", "--model", str(model), "--host", "127.0.0.1"]
                + ["--port", str(self.ports[f"engine-{node}"]), *ENGINE_ARGS],
                env,
            )
        self._spawn(
            "prometheus",
            [
                _binary("prometheus"),
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{self.ports['prometheus']}",
                "--rules.alert.resend-delay=1s",
                "--log.level=warn",
            ],
        )
        for am in ALERTMANAGERS:
            self._spawn(
                am,
                [
                    _binary("prometheus-alertmanager", "alertmanager"),
                    f"--config.file={tmp / 'alerts' / 'alertmanager.yml'}",
                    f"--storage.path={tmp / f'{am}-data'}",
                    f"--web.listen-address=127.0.0.1:{self.ports[am]}",
                    "--cluster.listen-address=",
                    "--log.level=warn",
                ],
            )
        for name in ("prometheus", *ALERTMANAGERS):
            wait_for(lambda n=name: self.http.get(f"{self.url(n)}/-/ready").status_code == 200, 60, f"{name}", self)
        for node in NODES:
            wait_for(
                lambda n=node: self.http.get(f"{self.url(f'engine-{n}')}/ready").status_code == 200,
                120,
                f"engine of {node}",
                self,
            )
        # The replayed pods have run for a day: the agents start once the engines serve, as
        # they would, and once the alerts their start-up raised (InferdEngineDown) are gone.
        wait_for(lambda: self.active_alerts() == [], 60, "no alert active", self)
        for node in NODES:
            self._spawn(
                f"agent-{node}",
                [
                    PY,
                    "-m",
                    "inferd.agent.cli",
                    "agent",
                    "--kubernetes",
                    f"--node-name={node}",
                    f"--kubeconfig={kubeconfig}",
                    "--engine-namespace=inferd",
                    *(f"--alertmanager-url={self.url(am)}" for am in ALERTMANAGERS),
                    "--kubernetes-interval=1",
                    f"--port={self.ports[f'agent-{node}']}",
                    "--no-collector=gpu",
                    "--no-collector=ebpf",
                    f"--webhook-token-file={tmp / 'webhook-token'}",
                    f"--admin-token-file={tmp / 'admin-token'}",
                    f"--audit-log={tmp / node / 'audit.jsonl'}",
                    f"--prometheus-url={self.url('prometheus')}",
                    f"--remediation-config={tmp / 'policy.yml'}",
                ],
                env,
            )
        for node in NODES:
            wait_for(lambda n=node: self.pods(n) == 1, 60, f"agent of {node} to find its engine pod", self)

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> None:
        log = open(self.tmp / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True
        )

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.api.close()
        self.http.close()

    def log_tails(self, lines: int = 25) -> str:
        out = []
        for path in sorted(self.tmp.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(out)

    # -- reading the state --

    def pods(self, node: str) -> float:
        text = self.http.get(f"{self.url(f'agent-{node}')}/metrics").text
        for line in text.splitlines():
            if line.startswith("inferd_kubernetes_engine_pods "):
                return float(line.split()[1])
        return -1

    def records(self, node: str) -> list[dict]:
        response = self.http.get(f"{self.url(f'agent-{node}')}/v1/actions", params={"limit": 0})
        return response.json()["records"]

    def active_alerts(self) -> list[str]:
        """Names of the remediate alerts Prometheus has pending or firing."""
        alerts = self.http.get(f"{self.url('prometheus')}/api/v1/alerts").json()["data"]["alerts"]
        names = [a["labels"]["alertname"] for a in alerts if a["labels"].get("remediate") == "true"]
        for am in ALERTMANAGERS:
            listed = self.http.get(f"{self.url(am)}/api/v2/alerts", params={"active": "true"}).json()
            names += [a["labels"]["alertname"] for a in listed]
        return names

    def webhook_sent(self) -> float:
        """Notifications Alertmanager delivered to the webhook (failed ones not counted)."""
        text = "\n".join(self.http.get(f"{self.url(am)}/metrics").text for am in ALERTMANAGERS)
        total = failed = 0.0
        for line in text.splitlines():
            if 'integration="webhook"' not in line or line.startswith("#"):
                continue
            if line.startswith("alertmanager_notifications_total"):
                total += float(line.split()[-1])
            elif line.startswith("alertmanager_notifications_failed_total"):
                failed += float(line.split()[-1])
        return total - failed

    def engine_config(self, node: str) -> dict:
        response = self.http.get(
            f"{self.url(f'engine-{node}')}/admin/config", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        return response.json()["config"]


def wait_for(predicate, timeout: float, what: str, fleet: Fleet | None = None, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (httpx.HTTPError, OSError, KeyError, ValueError) as exc:
            last_exc = exc
        time.sleep(interval)
    logs = fleet.log_tails() if fleet else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last_exc})\n{logs}")


class Load:
    """Closed-loop completions from `workers` threads against one engine."""

    def __init__(self, url: str, workers: int):
        self.url = url
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(workers)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)

    def _work(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                prompt = [rng.randrange(5, 500) for _ in range(24)]
                body = {"model": "tiny", "prompt": prompt, "max_tokens": 40, "ignore_eos": True, "temperature": 0}
                try:
                    self.statuses.append(client.post(f"{self.url}/v1/completions", json=body).status_code)
                except httpx.HTTPError:
                    self.statuses.append(0)
                    time.sleep(0.2)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    _binary("prometheus")
    _binary("prometheus-alertmanager", "alertmanager")
    tmp = tmp_path_factory.mktemp("e2e-kubernetes")
    model = tmp / "tiny"
    subprocess.run(
        [PY, "-m", "inferd.agent.cli", "make-model", str(model), "--preset", "tiny"],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    f = Fleet(tmp)
    try:
        f.start(model)
        yield f
    finally:
        f.stop()


def test_only_the_alerts_node_acts_and_once(fleet):
    assert fleet.engine_config("gpu-node-a")["max_num_seqs"] == 16
    with Load(fleet.url("engine-gpu-node-a"), workers=16):
        applied = wait_for(
            lambda: [r for r in fleet.records("gpu-node-a") if r["event"] == "applied"],
            120,
            "node a's agent to act on InferdKVCacheThrashing",
            fleet,
        )
        # the notification reached node b's agent (the webhook points at it), which left it alone
        wait_for(lambda: fleet.webhook_sent() >= 2, 30, "both Alertmanagers' notifications to node b's agent", fleet)
        time.sleep(5)  # more pulls and notifications of the same alert: nothing more happens
    [step] = applied
    assert (step["alert"], step["action"], step["pod"]) == (
        "InferdKVCacheThrashing",
        "lower_max_num_seqs",
        "inferd/inferd-engine-7d9c6b5f4-8xq2m",
    )
    assert step["old"] == {"max_num_seqs": 16} and step["new"] == {"max_num_seqs": 4}
    records_a = fleet.records("gpu-node-a")
    assert [r for r in records_a if r["event"] == "applied"] == applied
    routed = [r for r in records_a if r["event"] == "routed" and r["status"] == "firing"]
    assert [(r["alert"], r["labels"]["host"], r["pods"]) for r in routed] == [
        ("InferdKVCacheThrashing", "gpu-node-a", ["inferd/inferd-engine-7d9c6b5f4-8xq2m"])
    ]
    assert fleet.engine_config("gpu-node-a")["max_num_seqs"] == 4
    # node b: its agent recorded nothing, its engine kept its settings
    assert [r for r in fleet.records("gpu-node-b") if r["event"] in ("routed", "decision", "applied")] == []
    assert fleet.engine_config("gpu-node-b")["max_num_seqs"] == 16
    metrics_a = fleet.http.get(f"{fleet.url('agent-gpu-node-a')}/metrics").text
    assert 'inferd_kubernetes_alert_polls_total{result="ok"}' in metrics_a
