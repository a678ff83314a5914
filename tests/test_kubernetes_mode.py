"""The agent's Kubernetes mode against a replay of the API server and of Alertmanager.

No API server can run here. tests/fixtures/kubernetes/ holds the bodies a kube-apiserver
returns (PodList for a field- and label-selected list, the terminating Pod a DELETE
returns, Status objects for 404 and 403) and an Alertmanager API v2 alert list. A local
HTTP server replays them to the official `kubernetes` client, configured through a
kubeconfig like any other, and checks the query it receives (the field selector on
spec.nodeName, the label selector, the bearer token); the pods' IP and port are rewritten
to small engines on loopback (tests/remediation_fakes.py) so the admin calls are real HTTP.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from fastapi.testclient import TestClient
from kubernetes.client.exceptions import ApiException
from kubernetes_replay import API_TOKEN, ReplayApiServer, fixture, point_at

from inferd.agent.cli import command_parser
from inferd.agent.kubernetes.alert_pull import AlertPull, PullConfig, parse_alerts
from inferd.agent.kubernetes.discovery import DiscoveryConfig, PodDiscovery, load_core_api
from inferd.agent.kubernetes.node import KubernetesCollector, build
from inferd.agent.kubernetes.node_remediation import DeletionLimiter
from inferd.agent.kubernetes.pod_numa import PlacementReader, cgroup_names_pod
from inferd.agent.server import AgentState, create_app
from inferd.agent.webhook import make_webhook_router
from inferd.exporters.exposition import render_exposition
from inferd.exporters.registry import CollectorSet

from remediation_fakes import FakeEngine, ManualClock, _EngineHandler, alert_payload

ADMIN_TOKEN = "admin-secret"
HOOK_TOKEN = "hook-secret"
SELECTOR = "app.kubernetes.io/component=engine"


# ---- engines with /ready ------------------------------------------------------------------


class _PodEngineHandler(_EngineHandler):
    def do_GET(self) -> None:
        if self.path == "/ready":
            state = self.engine.ready_state  # type: ignore[attr-defined]
            if state == "ready":
                self._reply(200, {"status": "ready"})
            else:
                self._reply(503, {"error": {"message": state, "type": "service_unavailable", "code": state}})
            return
        super().do_GET()


class PodEngine(FakeEngine):
    def __init__(self, ready_state: str = "ready"):
        self.ready_state = ready_state
        super().__init__(ADMIN_TOKEN)
        self.httpd.RequestHandlerClass = _PodEngineHandler

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]


@pytest.fixture
def cluster(tmp_path):
    """Node a: pods a1 (ready) and a2 (its core stalled); node b: pod b1 (ready)."""
    engines = {"a1": PodEngine(), "a2": PodEngine("engine_stalled"), "b1": PodEngine()}
    a1, a2 = fixture("pods-gpu-node-a.json")["items"]
    [b1] = fixture("pods-gpu-node-b.json")["items"]
    api = ReplayApiServer(
        {
            "gpu-node-a": [point_at(a1, engines["a1"].port), point_at(a2, engines["a2"].port)],
            "gpu-node-b": [point_at(b1, engines["b1"].port)],
        }
    )
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    (tmp_path / "admin-token").write_text(ADMIN_TOKEN)
    (tmp_path / "webhook-token").write_text(HOOK_TOKEN)
    built = []

    def agent(node: str, *extra: str):
        args = command_parser("agent").parse_args(
            [
                "--kubernetes",
                f"--node-name={node}",
                f"--kubeconfig={kubeconfig}",
                "--engine-namespace=inferd",
                f"--admin-token-file={tmp_path / 'admin-token'}",
                f"--audit-log={tmp_path / node / 'audit.jsonl'}",
                "--prometheus-url=http://127.0.0.1:9",  # nothing there: the policy acts unverified
                *extra,
            ]
        )
        assembly = build(args)
        built.append(assembly)
        state = AgentState.with_collectors([assembly.collector])
        app = create_app(state, [make_webhook_router(state, assembly.node.remediation, tmp_path / "webhook-token")])
        return assembly.node, TestClient(app)

    yield api, engines, agent
    for assembly in built:
        for close in assembly.closers:
            close()
    api.close()
    for engine in engines.values():
        engine.close()


def post(client: TestClient, payload: dict) -> dict:
    response = client.post("/v1/alerts", json=payload, headers={"Authorization": f"Bearer {HOOK_TOKEN}"})
    assert response.status_code == 200, response.text
    [result] = response.json()["results"]
    return result


def engine_down(starts_at: str = "2026-11-29T10:00:00Z") -> dict:
    """InferdEngineDown as the rule makes it: about the node (`host`), no job or instance."""
    payload = alert_payload("InferdEngineDown", fingerprint="d0wn", starts_at=starts_at, host="gpu-node-a")
    for alert in payload["alerts"]:
        del alert["labels"]["job"], alert["labels"]["instance"]
    return payload


def engine_instance(engine: PodEngine) -> str:
    return f"127.0.0.1:{engine.port}"


# ---- discovery ----------------------------------------------------------------------------


def test_discovery_asks_for_this_nodes_engines_and_reads_ip_port_readiness(cluster, tmp_path):
    api, engines, _ = cluster
    discovery = PodDiscovery(
        DiscoveryConfig("gpu-node-a", SELECTOR, "inferd"), load_core_api(api.kubeconfig(tmp_path / "kc"))
    )
    pods = discovery.list()
    assert [(p.name, p.ip, p.port, p.is_ready, p.phase) for p in pods] == [
        ("inferd-engine-7d9c6b5f4-8xq2m", "127.0.0.1", engines["a1"].port, True, "Running"),
        ("inferd-engine-7d9c6b5f4-t5kzp", "127.0.0.1", engines["a2"].port, False, "Running"),
    ]
    assert pods[0].uid == "6b1f0d9e-2c4a-4f7b-8e3d-5a9c1b7e2f40" and pods[0].node_name == "gpu-node-a"
    [request] = api.requests
    assert request["path"] == "/api/v1/namespaces/inferd/pods"
    assert request["query"]["fieldSelector"] == ["spec.nodeName=gpu-node-a"]
    assert request["query"]["labelSelector"] == [SELECTOR]
    assert request["authorization"] == f"Bearer {API_TOKEN}"


def test_every_namespace_lists_through_the_cluster_path(cluster, tmp_path):
    api, _, _ = cluster
    discovery = PodDiscovery(DiscoveryConfig("gpu-node-b", SELECTOR, ""), load_core_api(api.kubeconfig(tmp_path / "k")))
    assert [p.name for p in discovery.list()] == ["inferd-engine-7d9c6b5f4-w9hvd"]
    assert api.requests[-1]["path"] == "/api/v1/pods"


def test_pods_of_another_node_are_dropped_even_when_the_server_sends_them(cluster, tmp_path):
    api, _, _ = cluster
    api.ignore_field_selector = True
    discovery = PodDiscovery(
        DiscoveryConfig("gpu-node-b", SELECTOR, "inferd"), load_core_api(api.kubeconfig(tmp_path / "k"))
    )
    assert [p.node_name for p in discovery.list()] == ["gpu-node-b"]


def test_a_forbidden_list_marks_the_collector_down_and_keeps_the_pods(cluster):
    api, _, agent = cluster
    node, _ = agent("gpu-node-a")
    node.refresh()
    assert len(node.status) == 2
    api.forbidden = True
    with pytest.raises(ApiException) as info:
        node.discovery.list()
    assert info.value.status == 403
    node.refresh()
    assert node.api_error == (
        'HTTP 403 Forbidden: pods is forbidden: User "system:serviceaccount:inferd:inferd-agent" '
        'cannot list resource "pods" in API group "" at the cluster scope'
    )
    assert len(node.remediation.pods) == 2  # a failed list is no evidence the pods left
    text = render_exposition(CollectorSet([KubernetesCollector(node)]).collect()).decode()
    assert 'inferd_collector_up{collector="kubernetes"} 0.0' in text
    assert "inferd_engine_up" not in text


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"node_name": ""}, "node name is empty"),
        ({"node_name": "n", "label_selector": "a b c"}, "bad label selector"),
        ({"node_name": "n", "port_name": "Not_A_Port"}, "IANA_SVC_NAME"),
    ],
)
def test_discovery_config_is_validated(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        DiscoveryConfig(**kwargs)


# ---- acting on the right node's engines ---------------------------------------------------


def test_an_alert_about_an_engine_here_changes_that_engine_only(cluster):
    _, engines, agent = cluster
    node_a, client_a = agent("gpu-node-a")
    node_b, client_b = agent("gpu-node-b")
    node_a.refresh()
    node_b.refresh()
    payload = alert_payload(instance=engine_instance(engines["a1"]), host="gpu-node-a")
    # node b's agent gets node a's alert (one webhook URL behind a Service): not its own
    assert post(client_b, payload)["result"] == "other_node"
    result = post(client_a, payload)
    assert (result["result"], result["pod"]) == ("applied", "inferd/inferd-engine-7d9c6b5f4-8xq2m")
    assert engines["a1"].config["max_num_seqs"] < 64
    assert engines["a2"].changes == [] and engines["b1"].changes == []
    assert post(client_a, payload)["result"] == "duplicate"
    assert len(engines["a1"].changes) == 1
    records = client_a.get("/v1/actions", params={"limit": 0}).json()["records"]
    applied = [r for r in records if r["event"] == "applied"]
    assert [(r["pod"], r["action"]) for r in applied] == [
        ("inferd/inferd-engine-7d9c6b5f4-8xq2m", "lower_max_num_seqs")
    ]
    assert client_b.get("/v1/actions", params={"limit": 0}).json()["records"] == []


def test_an_alert_for_an_engine_that_is_not_here_acts_on_nothing(cluster):
    _, engines, agent = cluster
    node_a, client_a = agent("gpu-node-a")
    node_a.refresh()
    result = post(client_a, alert_payload(instance="10.244.9.9:8000", host="gpu-node-a"))
    assert result["result"] == "no_engine"
    assert all(e.changes == [] for e in engines.values())


def test_a_stalled_engine_pod_is_deleted_and_a_ready_one_is_not(cluster):
    api, engines, agent = cluster
    node_a, client_a = agent("gpu-node-a")
    node_a.refresh()
    result = post(client_a, engine_down())
    assert (result["result"], result["pod"]) == ("applied", "inferd/inferd-engine-7d9c6b5f4-t5kzp")
    [delete] = api.deletes()
    assert delete["path"] == "/api/v1/namespaces/inferd/pods/inferd-engine-7d9c6b5f4-t5kzp"
    assert delete["body"]["preconditions"] == {"uid": "a8e3c7d2-9f1b-4b6e-a0c5-3d7f2e8b1c96"}
    assert delete["authorization"] == f"Bearer {API_TOKEN}"
    node_a.refresh()
    assert [p.name for p in node_a.remediation.pods] == ["inferd-engine-7d9c6b5f4-8xq2m"]
    # the ready pod: a restart alert finds nothing to delete
    assert post(client_a, engine_down(starts_at="2026-11-29T11:00:00Z"))["result"] == "no_engine"
    assert len(api.deletes()) == 1


@pytest.mark.parametrize(
    "state, fragment",
    [
        ("just started", "grace 120s); not deleted"),
        ({"waiting": {"reason": "ContainerCreating"}}, "Running with a container not running; not deleted"),
    ],
)
def test_a_pod_that_may_still_be_starting_is_not_deleted(cluster, state, fragment):
    api, _, agent = cluster
    if state == "just started":
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        state = {"running": {"startedAt": now}}
    api.pods_by_node["gpu-node-a"][1]["status"]["containerStatuses"][0]["state"] = state
    node_a, client_a = agent("gpu-node-a")
    node_a.refresh()
    result = post(client_a, engine_down())
    assert result["result"] == "failed" and fragment in result["error"], result
    assert api.deletes() == []


def test_pod_deletions_are_rate_limited_per_node(cluster):
    api, engines, agent = cluster
    engines["a1"].ready_state = "engine_dead"
    node_a, client_a = agent("gpu-node-a")  # the default: one deletion per 600 s
    node_a.refresh()
    result = post(client_a, engine_down())
    assert result["result"] == "per_pod"
    outcomes = sorted(r["result"] for r in result["pods"].values())
    assert outcomes == ["applied", "failed"]
    [failed] = [r for r in result["pods"].values() if r["result"] == "failed"]
    assert "limit 1" in failed["error"]
    assert len(api.deletes()) == 1


def test_deletion_limiter_counts_a_window():
    clock = ManualClock()
    limiter = DeletionLimiter(2, 60, clock)
    assert limiter.take() is None and limiter.take() is None
    assert "limit 2" in (limiter.take() or "")
    clock.advance(60)
    assert limiter.take() is None


# ---- pulling from Alertmanager ------------------------------------------------------------


class ReplayAlertmanager:
    """GET /api/v2/alerts applying `filter` matchers (label="value") like Alertmanager."""

    def __init__(self, alerts: list[dict]):
        self.alerts = alerts
        self.queries: list[dict[str, list[str]]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = parse_qs(url.query)
                owner.queries.append(query)
                matchers = [f.split("=", 1) for f in query.get("filter", [])]
                selected = [a for a in owner.alerts if all(a["labels"].get(k) == v.strip('"') for k, v in matchers)]
                data = json.dumps(selected).encode()
                self.send_response(200 if url.path == "/api/v2/alerts" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def alertmanager(cluster):
    _, engines, _ = cluster
    alerts = fixture("alertmanager-alerts.json")
    # the recorded instances, pointed at the loopback engines
    alerts[0]["labels"]["instance"] = engine_instance(engines["a1"])
    alerts[1]["labels"]["instance"] = engine_instance(engines["b1"])
    am = ReplayAlertmanager(alerts)
    yield am
    am.close()


def test_each_agent_pulls_its_own_nodes_alerts_and_acts_once(cluster, alertmanager):
    _, engines, agent = cluster
    nodes = {}
    for name in ("gpu-node-a", "gpu-node-b"):
        node, _ = agent(name, f"--alertmanager-url={alertmanager.url}")
        nodes[name] = node
    for _ in range(3):  # every poll lists the alert again: acted on once
        for node in nodes.values():
            node.refresh()
    assert len(engines["a1"].changes) == 1 and len(engines["b1"].changes) == 1
    assert engines["a2"].changes == []
    query = alertmanager.queries[0]
    assert query["filter"] == ['host="gpu-node-a"', 'remediate="true"']
    assert (query["active"], query["silenced"], query["inhibited"]) == (["true"], ["false"], ["false"])


def test_a_resolved_alert_goes_to_the_pods_its_firing_went_to(cluster, alertmanager):
    _, engines, agent = cluster
    node, client = agent("gpu-node-a", f"--alertmanager-url={alertmanager.url}")
    node.refresh()
    assert node.pull is not None
    node.pull.config.resolve_after_s = 0
    alertmanager.alerts[:] = alertmanager.alerts[1:]  # node a's alert resolved
    node.refresh()
    records = client.get("/v1/actions", params={"limit": 0}).json()["records"]
    routed = [(r["status"], r["pods"]) for r in records if r["event"] == "routed"]
    pod = ["inferd/inferd-engine-7d9c6b5f4-8xq2m"]
    assert routed == [("firing", pod), ("resolved", pod)]
    policy_saw = [(r["status"], r["pod"]) for r in records if r["event"] == "alert"]
    assert policy_saw == [("firing", pod[0]), ("resolved", pod[0])]
    assert node.remediation.firing == []


def test_alerts_wait_while_the_api_server_cannot_be_listed(cluster, alertmanager):
    api, engines, agent = cluster
    api.forbidden = True
    node, _ = agent("gpu-node-a", f"--alertmanager-url={alertmanager.url}")
    node.refresh()
    assert alertmanager.queries == [] and engines["a1"].changes == []
    api.forbidden = False
    node.refresh()
    assert len(engines["a1"].changes) == 1


def test_a_restarted_agent_does_not_act_again(cluster, alertmanager):
    _, engines, agent = cluster
    first, _ = agent("gpu-node-a", f"--alertmanager-url={alertmanager.url}")
    first.refresh()
    first.stop()
    second, _ = agent("gpu-node-a", f"--alertmanager-url={alertmanager.url}")
    second.refresh()
    second.refresh()
    assert len(engines["a1"].changes) == 1


def test_two_replicas_are_merged_and_one_down_is_skipped(alertmanager):
    clock = ManualClock()
    pull = AlertPull(
        # two replicas answering the same alert, and one that does not answer
        PullConfig(
            (alertmanager.url, alertmanager.url, "http://127.0.0.1:9"), "host", "gpu-node-a", resolve_after_s=10
        ),
        clock,
    )
    [alert] = pull.poll()
    assert (alert.name, alert.status, alert.fingerprint) == ("InferdKVCacheThrashing", "firing", "8c2e5f1a9b3d7046")
    assert pull.polls_total == {"ok": 1, "failed": 0}
    # the alert leaves Alertmanager: resolved once it has been missing for resolve_after_s
    alertmanager.alerts[:] = alertmanager.alerts[1:]
    assert pull.poll() == []
    clock.advance(10)
    [resolved] = pull.poll()
    assert (resolved.status, resolved.starts_at) == ("resolved", "2026-12-01T09:01:30.112Z")
    assert pull.poll() == []


def test_no_answer_resolves_nothing():
    clock = ManualClock()
    pull = AlertPull(PullConfig(("http://127.0.0.1:9",), "host", "n", resolve_after_s=0), clock)
    pull.seed(parse_alerts(fixture("alertmanager-alerts.json")[:1], "fixture"))
    assert pull.poll() == [] and pull.polls_total["failed"] == 1


def test_a_malformed_alert_list_item_is_skipped():
    items = fixture("alertmanager-alerts.json")
    items[1]["labels"] = "not a map"
    assert [a.fingerprint for a in parse_alerts(items, "fixture")] == ["8c2e5f1a9b3d7046", "5a0b8e2d6c1f3947"]
    with pytest.raises(ValueError, match="expected a JSON list"):
        parse_alerts({"data": []}, "fixture")


# ---- NUMA placement of a pod --------------------------------------------------------------

UID = "6b1f0d9e-2c4a-4f7b-8e3d-5a9c1b7e2f40"


def numa_tree(root: Path, cpus_allowed: str, numa_maps: str) -> tuple[Path, Path]:
    """Two nodes (CPUs 0-3 on 0, 4-7 on 1); GPU minor 1 at 0000:1b:00.0 on node 1; the pod's
    engine (pid 4242, holds /dev/nvidia1) and its pause process (pid 4200, no GPU)."""
    sys_root, proc = root / "sys", root / "proc"
    for node, cpus in ((0, "0-3"), (1, "4-7")):
        (sys_root / f"devices/system/node/node{node}").mkdir(parents=True)
        (sys_root / f"devices/system/node/node{node}/cpulist").write_text(cpus + "\n")
    (sys_root / "bus/pci/devices/0000:1b:00.0").mkdir(parents=True)
    (sys_root / "bus/pci/devices/0000:1b:00.0/numa_node").write_text("1\n")
    info = proc / "driver/nvidia/gpus/0000:1b:00.0"
    info.mkdir(parents=True)
    info.joinpath("information").write_text(
        "Model: \t\t NVIDIA H200\nIRQ:   \t\t 254\nGPU UUID: \t GPU-5f0c2e9d\nBus Type: \t PCIe\n"
        "Bus Location: \t 0000:1b:00.0\nDevice Minor: \t 1\n"
    )
    slice_ = f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice"
    for pid, gpu in ((4200, False), (4242, True)):
        d = proc / str(pid)
        (d / "fd").mkdir(parents=True)
        d.joinpath("cgroup").write_text(f"0::{slice_}/cri-containerd-{pid:x}.scope\n")
        d.joinpath("status").write_text(f"Name:\tx\nCpus_allowed_list:\t{cpus_allowed}\nMems_allowed_list:\t0-1\n")
        d.joinpath("numa_maps").write_text(numa_maps)
        os.symlink("/dev/null", d / "fd" / "0")
        if gpu:
            os.symlink("/dev/nvidia1", d / "fd" / "7")
            os.symlink("/dev/nvidiactl", d / "fd" / "8")
    other = proc / "999"
    other.mkdir()
    other.joinpath("cgroup").write_text("0::/system.slice/sshd.service\n")
    return proc, sys_root


def test_cgroup_paths_of_both_drivers_name_the_pod():
    assert cgroup_names_pod(f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/x.scope\n", UID)
    assert cgroup_names_pod(f"11:cpuset:/kubepods/burstable/pod{UID}/0123abcd\n", UID)
    assert not cgroup_names_pod("0::/kubepods.slice/kubepods-podffff.slice\n", UID)


def test_a_pod_on_its_gpus_node_is_aligned(tmp_path):
    proc, sys_root = numa_tree(tmp_path, "4-7", "7f00 default anon=100 dirty=100 N1=100 kernelpagesize_kB=4\n")
    placement = PlacementReader(proc, sys_root).placement(UID)
    assert placement is not None
    assert (placement.gpu_nodes, placement.cpu_nodes, placement.num_processes) == ((1,), (1,), 1)
    assert not placement.is_cpus_misaligned and not placement.is_memory_misaligned(0.2)


def test_a_pod_on_the_other_socket_is_reported_misaligned(tmp_path, cluster):
    proc, sys_root = numa_tree(tmp_path, "0-3", "7f00 default anon=100 N0=70 N1=30 kernelpagesize_kB=4\n")
    placement = PlacementReader(proc, sys_root).placement(UID)
    assert placement is not None and placement.is_cpus_misaligned
    assert placement.remote_memory_ratio == pytest.approx(0.7) and placement.is_memory_misaligned(0.2)
    _, _, agent = cluster
    node, client = agent("gpu-node-a", f"--procfs-root={proc}", f"--sysfs-root={sys_root}")
    node.refresh()
    text = client.get("/metrics").text
    pod = 'namespace="inferd",pod="inferd-engine-7d9c6b5f4-8xq2m"'
    assert f'inferd_pod_numa_misaligned{{{pod},resource="cpus"}} 1.0' in text
    assert f'inferd_pod_numa_misaligned{{{pod},resource="memory"}} 1.0' in text
    assert f"inferd_pod_numa_remote_memory_ratio{{{pod}}} 0.7" in text
    # the other pod holds no GPU in this tree: no placement series
    assert 't5kzp",resource' not in text
    assert f"inferd_engine_up{{{pod}}} 1.0" in text
    promtool = shutil.which("promtool")
    if promtool:  # the exposition follows Prometheus' naming rules
        lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout + lint.stderr
    assert (
        'inferd_engine_ready_state{namespace="inferd",pod="inferd-engine-7d9c6b5f4-t5kzp",state="engine_stalled"} 1.0'
        in text
    )


# ---- the command line ---------------------------------------------------------------------


def test_kubernetes_mode_without_a_node_name_exits_2(tmp_path, capsys, monkeypatch):
    from inferd.agent.cli import main

    monkeypatch.delenv("NODE_NAME", raising=False)
    code = main(
        [
            "agent",
            "--kubernetes",
            "--node-name=",
            "--no-collector",
            "gpu",
            "--no-collector",
            "ebpf",
            f"--audit-log={tmp_path / 'a.jsonl'}",
            f"--kubeconfig={tmp_path / 'missing'}",
        ]
    )
    assert code == 2
    assert "node name is empty" in capsys.readouterr().err
