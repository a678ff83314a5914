"""`inferd agent --kubernetes`: the loop over this node's engine pods, its options and collector.

Every `interval_s` the loop lists this node's engine pods (agent.kubernetes.discovery),
probes each one's /ready, hands the pods to the per-pod remediation policies
(agent.kubernetes.node_remediation), pulls the firing alerts about this node from
Alertmanager when `--alertmanager-url` is given (agent.kubernetes.alert_pull) and routes
them; every `numa_interval_s` it checks each pod's NUMA placement (agent.kubernetes.pod_numa).
The webhook (/v1/alerts) stays open and routes the same way, dropping other nodes' alerts.

Engine metrics are not scraped or repeated here: each engine pod is a Prometheus target of
its own (the engine's ServiceMonitor), with its pod, namespace and node, and its own `up`
that InferdEngineDown reads; the agent adds only what Prometheus cannot see from outside,
the engine's readiness as the agent probes it and its NUMA placement.

    inferd_kubernetes_engine_pods                               engine pods found on this node
    inferd_kubernetes_engine_pod_info{namespace,pod,pod_ip,port} 1 per pod
    inferd_engine_up{namespace,pod}                             1 while its /ready says ready
    inferd_engine_ready_state{namespace,pod,state}              1 for its current /ready state
    inferd_engine_loading_seconds{namespace,pod}                time its /ready has said loading
    inferd_pod_numa_misaligned{namespace,pod,resource}          1 when its cpus / memory sit off its GPUs' node
    inferd_pod_numa_remote_memory_ratio{namespace,pod}          share of its resident pages off that node
    inferd_kubernetes_alert_polls_total{result}                 pulls from Alertmanager (ok, failed)

The collector reports `up` 0 while the API server cannot be listed (the last list's error).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from inferd.agent.audit import AuditLog
from inferd.agent.kubernetes.alert_pull import AlertPull, PullConfig
from inferd.agent.kubernetes.discovery import DiscoveryConfig, EnginePod, PodDiscovery, load_core_api
from inferd.agent.kubernetes.node_remediation import (
    READY_STATES,
    DeletionLimiter,
    NodeRemediation,
    PodHost,
    probe_ready,
)
from inferd.agent.kubernetes.pod_numa import PlacementReader, PodPlacement
from inferd.agent.remediation import PolicyConfig, RemediationPolicy
from inferd.exporters.registry import CollectorUnavailable

log = logging.getLogger(__name__)


@dataclass(slots=True)
class NodeConfig:
    node_label: str = "host"
    """The alert label that names the Kubernetes node (the scrape configs' `host`)."""
    engine_job: str = "inferd-engine"
    interval_s: float = 5.0
    numa_interval_s: float = 30.0
    numa_remote_ratio: float = 0.2
    max_pod_deletions: int = 1
    pod_deletion_window_s: float = 600.0
    pod_startup_grace_s: float = 120.0
    """A pod whose containers have run for less is never deleted (it may still be starting)."""

    def __post_init__(self) -> None:
        for name in ("interval_s", "numa_interval_s", "pod_deletion_window_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        if isinstance(self.pod_startup_grace_s, bool) or not isinstance(self.pod_startup_grace_s, (int, float)):
            raise ValueError(f"pod_startup_grace_s must be a number, got {self.pod_startup_grace_s!r}")
        if self.pod_startup_grace_s < 0:
            raise ValueError(f"pod_startup_grace_s must be >= 0, got {self.pod_startup_grace_s}")
        if not 0 <= self.numa_remote_ratio <= 1:
            raise ValueError(f"numa_remote_ratio must be in [0, 1], got {self.numa_remote_ratio}")
        if isinstance(self.max_pod_deletions, bool) or not isinstance(self.max_pod_deletions, int):
            raise ValueError(f"max_pod_deletions must be an integer, got {self.max_pod_deletions!r}")
        if self.max_pod_deletions < 0:
            raise ValueError(f"max_pod_deletions must be >= 0, got {self.max_pod_deletions}")
        if not self.node_label or not self.engine_job:
            raise ValueError("node_label and engine_job must not be empty")


@dataclass(slots=True)
class PodStatus:
    """What the loop last saw of one pod."""

    pod: EnginePod
    state: str = "unreachable"
    loading_since: float | None = None
    placement: PodPlacement | None = None


class KubernetesNode:
    def __init__(
        self,
        discovery: PodDiscovery,
        remediation: NodeRemediation,
        config: NodeConfig | None = None,
        pull: AlertPull | None = None,
        placement: PlacementReader | None = None,
        probe: Callable[[str], str] = probe_ready,
        clock: Callable[[], float] = time.time,
    ):
        self.discovery = discovery
        self.remediation = remediation
        self.config = config or NodeConfig()
        self.pull = pull
        self.placement = placement
        self.probe = probe
        self._clock = clock
        self._lock = threading.Lock()
        self.status: dict[str, PodStatus] = {}  # uid -> status
        self.api_error: str | None = "not listed yet"
        self._numa_checked = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if pull is not None:
            pull.seed(remediation.firing)

    def refresh(self) -> None:
        """One round: pods, their readiness, NUMA placement when due, then the alerts."""
        try:
            pods = self.discovery.list()
        except Exception as exc:  # the client's ApiException, urllib3's errors: keep the last pods
            error = describe_api_error(exc)
            if error != self.api_error:
                log.warning("listing engine pods failed: %s", error)
            self.api_error = error
        else:
            if self.api_error is not None:
                log.info("engine pods on %s: %s", self.discovery.config.node_name, [p.key for p in pods] or "none")
            self.api_error = None
            self._update(pods)
        # Alerts wait while the pods are unknown: routed now, they would find no engine.
        if self.pull is not None and self.api_error is None:
            for alert in self.pull.poll():
                try:
                    self.remediation.handle(alert)
                except Exception:  # one alert's failure must not stop the others
                    log.exception("handling pulled alert %s failed", alert.name)

    def _update(self, pods: list[EnginePod]) -> None:
        now = self._clock()
        check_numa = self.placement is not None and now - self._numa_checked >= self.config.numa_interval_s
        status: dict[str, PodStatus] = {}
        for pod in pods:
            old = self.status.get(pod.uid)
            state = self.probe(pod.url) if pod.url else "unreachable"
            loading_since = None
            if state == "loading":
                loading_since = old.loading_since if old and old.loading_since is not None else now
            placement = old.placement if old else None
            if check_numa and self.placement is not None:
                try:
                    placement = self.placement.placement(pod.uid)
                except OSError as exc:
                    log.warning("NUMA placement of pod %s: %s", pod.key, exc)
            status[pod.uid] = PodStatus(pod, state, loading_since, placement)
        if check_numa:
            self._numa_checked = now
        with self._lock:
            self.status = status
        self.remediation.update_pods(pods, {uid: s.state for uid, s in status.items()})

    # -- the thread --

    def start(self) -> None:
        if self._thread is not None:
            return

        def loop() -> None:
            while True:
                try:
                    self.refresh()
                except Exception:
                    log.exception("Kubernetes refresh failed")
                if self._stop.wait(self.config.interval_s):
                    return

        self._thread = threading.Thread(target=loop, name="kubernetes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.remediation.stop()
        if self.pull is not None:
            self.pull.close()


def describe_api_error(exc: Exception) -> str:
    """One line: the API server's status and message for an ApiException, else the error."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status > 0:
        message = ""
        try:
            message = json.loads(getattr(exc, "body", None) or "{}").get("message", "")
        except (ValueError, AttributeError):
            pass
        return f"HTTP {status} {getattr(exc, 'reason', '') or ''}: {message}".rstrip(": ")
    return f"{type(exc).__name__}: {exc}"


class KubernetesCollector:
    name = "kubernetes"

    def __init__(self, node: KubernetesNode):
        self.node = node

    def collect(self) -> Iterable[Metric]:
        node = self.node
        if node.api_error is not None:
            raise CollectorUnavailable(f"Kubernetes API: {node.api_error}")
        with node._lock:
            status = sorted(node.status.values(), key=lambda s: s.pod.key)
        now = node._clock()
        pods = GaugeMetricFamily("inferd_kubernetes_engine_pods", "Engine pods the agent found on its node")
        info = GaugeMetricFamily(
            "inferd_kubernetes_engine_pod_info",
            "One engine pod on this node: its IP and engine port",
            labels=["namespace", "pod", "pod_ip", "port"],
        )
        up = GaugeMetricFamily(
            "inferd_engine_up", "1 while the engine pod's /ready answers ready, else 0", labels=["namespace", "pod"]
        )
        state = GaugeMetricFamily(
            "inferd_engine_ready_state",
            "1 for the engine pod's current readiness state, 0 for the others",
            labels=["namespace", "pod", "state"],
        )
        loading = GaugeMetricFamily(
            "inferd_engine_loading_seconds",
            "Seconds the engine pod's /ready has said loading (0 when it does not)",
            labels=["namespace", "pod"],
        )
        misaligned = GaugeMetricFamily(
            "inferd_pod_numa_misaligned",
            "1 when the engine pod's CPUs (resource=cpus) or resident memory (resource=memory) "
            "sit on a NUMA node other than its GPUs'",
            labels=["namespace", "pod", "resource"],
        )
        remote = GaugeMetricFamily(
            "inferd_pod_numa_remote_memory_ratio",
            "Share of the engine pod's resident pages on NUMA nodes other than its GPUs'",
            labels=["namespace", "pod"],
        )
        pods.add_metric([], len(status))
        for s in status:
            ns, name = s.pod.namespace, s.pod.name
            info.add_metric([ns, name, s.pod.ip or "", str(s.pod.port or "")], 1)
            up.add_metric([ns, name], 1.0 if s.state == "ready" else 0.0)
            for candidate in READY_STATES:
                state.add_metric([ns, name, candidate], 1.0 if candidate == s.state else 0.0)
            loading.add_metric([ns, name], now - s.loading_since if s.loading_since is not None else 0.0)
            if s.placement is not None:
                misaligned.add_metric([ns, name, "cpus"], 1.0 if s.placement.is_cpus_misaligned else 0.0)
                is_remote = s.placement.is_memory_misaligned(node.config.numa_remote_ratio)
                misaligned.add_metric([ns, name, "memory"], 1.0 if is_remote else 0.0)
                ratio = s.placement.remote_memory_ratio
                if ratio is not None:
                    remote.add_metric([ns, name], ratio)
        yield from (pods, info, up, state, loading, misaligned, remote)
        if node.pull is not None:
            polls = CounterMetricFamily(
                "inferd_kubernetes_alert_polls", "Pulls of this node's alerts from Alertmanager", labels=["result"]
            )
            for result, count in sorted(node.pull.polls_total.items()):
                polls.add_metric([result], count)
            yield polls


# ---- options and assembly ---------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "kubernetes", "Kubernetes mode: act on this node's engine pods, supervise nothing (docs/ADMIN.md)"
    )
    group.add_argument(
        "--kubernetes",
        action="store_true",
        help="find this node's engine pods through the Kubernetes API instead of running an engine",
    )
    group.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's Kubernetes name (default: $NODE_NAME)",
    )
    group.add_argument(
        "--engine-label-selector",
        default="app.kubernetes.io/component=engine",
        help="label selector of the engine pods",
    )
    group.add_argument(
        "--engine-namespace",
        default=None,
        help="namespace of the engine pods; '*' for every namespace (default: $POD_NAMESPACE, else every namespace)",
    )
    group.add_argument("--engine-port-name", default="http", help="the engine container's port: its name or number")
    group.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: in-cluster, else ~/.kube/config)")
    group.add_argument(
        "--alertmanager-url",
        action="append",
        default=[],
        metavar="URL",
        help="Alertmanager to pull this node's firing alerts from (repeat for each HA replica); "
        "without it only the webhook delivers alerts",
    )
    group.add_argument(
        "--node-label",
        default="host",
        help="the alert label that names the node (default host, the scrape configs' label)",
    )
    group.add_argument("--kubernetes-interval", type=float, default=5.0, help="seconds between rounds (pods, alerts)")
    group.add_argument(
        "--max-pod-deletions",
        type=int,
        default=1,
        help="stalled engine pods the agent may delete per --pod-deletion-window on this node (0: never)",
    )
    group.add_argument("--pod-deletion-window", type=float, default=600.0, help="seconds (see --max-pod-deletions)")
    group.add_argument(
        "--pod-startup-grace",
        type=float,
        default=120.0,
        help="seconds an engine pod's containers must have run before the agent may delete it",
    )


@dataclass(slots=True)
class Assembly:
    """What `build` made, for the agent to mount, register and stop."""

    node: KubernetesNode
    collector: KubernetesCollector
    closers: list[Callable[[], None]] = field(default_factory=list)


def build(args: argparse.Namespace, api: Any = None) -> Assembly:
    """The Kubernetes mode from the agent's arguments; ValueError names what is wrong."""
    from inferd.agent.engine_client import EngineClient, token_from
    from inferd.agent.prometheus import PrometheusClient
    from inferd.agent.remediation_config import load_policy_config
    from inferd.agent.webhook import audit_log_from

    logging.getLogger("httpx").setLevel(logging.WARNING)
    namespace = args.engine_namespace
    if namespace is None:
        namespace = os.environ.get("POD_NAMESPACE", "")
    discovery_config = DiscoveryConfig(
        node_name=args.node_name,
        label_selector=args.engine_label_selector,
        namespace="" if namespace == "*" else namespace,
        port_name=args.engine_port_name,
    )
    config = NodeConfig(
        node_label=args.node_label,
        interval_s=args.kubernetes_interval,
        max_pod_deletions=args.max_pod_deletions,
        pod_deletion_window_s=args.pod_deletion_window,
        pod_startup_grace_s=args.pod_startup_grace,
    )
    discovery = PodDiscovery(discovery_config, api if api is not None else load_core_api(args.kubeconfig))
    pull = None
    if args.alertmanager_url:
        pull = AlertPull(PullConfig(tuple(args.alertmanager_url), config.node_label, discovery_config.node_name))
    token = token_from(path=getattr(args, "admin_token_file", None))
    if token is None:
        log.warning("no engine admin token (--admin-token-file or INFERD_ADMIN_TOKEN): engine settings cannot change")
    audit = audit_log_from(args)
    limiter = DeletionLimiter(config.max_pod_deletions, config.pod_deletion_window_s)
    for record in audit.read():
        if record.get("event") == "applied" and str(record.get("detail") or "").startswith("deleted pod"):
            limiter.note(float(record["ts"]))
    prometheus_url = getattr(args, "prometheus_url", "http://127.0.0.1:9090")

    def make_policy(pod: EnginePod, pod_config: PolicyConfig, pod_audit: AuditLog) -> RemediationPolicy:
        engine = EngineClient(pod.url, token) if token and pod.url else None
        # restart_engine only: the policy asks a host for the methods it has (no rebind here)
        host: Any = PodHost(pod, discovery, limiter, startup_grace_s=config.pod_startup_grace_s)
        policy = RemediationPolicy(engine, pod_audit, pod_config, PrometheusClient(prometheus_url), host=host)
        policy.start()
        return policy

    remediation = NodeRemediation(
        discovery_config.node_name, config.node_label, audit, load_policy_config(args), make_policy, config.engine_job
    )
    placement = PlacementReader(getattr(args, "procfs_root", "/proc"), getattr(args, "sysfs_root", "/sys"))
    node = KubernetesNode(discovery, remediation, config, pull, placement)
    return Assembly(node, KubernetesCollector(node), [node.stop])
