"""The engine pods on this node, through the Kubernetes API (the official `kubernetes` client).

One list call per refresh: `GET /api/v1/namespaces/<ns>/pods` (or `/api/v1/pods` for
every namespace) with `fieldSelector=spec.nodeName=<node>` and the engine's label
selector, so the API server sends only this node's engines. Each pod gives its IP
(`status.podIP`) and the engine port: the container port named `port_name` ("http" in
deploy/kubernetes). A pod the server returns for another node (a server that ignored the
field selector) is dropped here too: acting on another node's engine is the one thing
this mode must never do.

The client is configured from a kubeconfig when one is given (or KUBECONFIG /
~/.kube/config exists outside a cluster), else from the pod's service account.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

MISSING_CLIENT = "--kubernetes needs the official Kubernetes client, a dependency of inferd: pip install kubernetes"
_PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$")  # IANA_SVC_NAME, as the API validates it
_SELECTOR_TERM = re.compile(r"^!?[A-Za-z0-9./_-]+(\s*(==|!=|=)\s*[A-Za-z0-9._-]*|\s+(in|notin)\s+\(.*\))?$")


@dataclass(slots=True, frozen=True)
class EnginePod:
    """What the agent needs of one engine pod."""

    namespace: str
    name: str
    uid: str
    node_name: str
    ip: str | None
    port: int | None
    phase: str
    is_ready: bool  # the pod's Ready condition, as the kubelet reports it
    is_deleting: bool  # metadata.deletionTimestamp is set
    started_at: float | None = None
    """Unix time its containers have all been running since (the latest start); None while one is not running."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def instance(self) -> str | None:
        """The address Prometheus scrapes it at: the `instance` label of its series."""
        return f"{self.ip}:{self.port}" if self.ip and self.port else None

    @property
    def url(self) -> str | None:
        return f"http://{self.instance}" if self.instance else None


@dataclass(slots=True)
class DiscoveryConfig:
    node_name: str
    label_selector: str = "app.kubernetes.io/component=engine"
    namespace: str = ""
    """The engines' namespace; "" lists every namespace (that needs a ClusterRole)."""
    port_name: str = "http"
    """The engine container's port: its name, or a number."""
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.node_name or not isinstance(self.node_name, str):
            raise ValueError("the node name is empty: give --node-name or set NODE_NAME")
        terms = [t.strip() for t in _split_selector(self.label_selector)]
        if not self.label_selector.strip() or not all(_SELECTOR_TERM.match(t) for t in terms):
            raise ValueError(f"bad label selector {self.label_selector!r} (e.g. app.kubernetes.io/component=engine)")
        if not (self.port_name.isdigit() and 0 < int(self.port_name) < 65536) and not _PORT_NAME.match(self.port_name):
            raise ValueError(f"engine port {self.port_name!r} is neither a port name (IANA_SVC_NAME) nor 1..65535")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")

    @property
    def field_selector(self) -> str:
        return f"spec.nodeName={self.node_name}"


def _split_selector(selector: str) -> list[str]:
    """Split on the commas between terms, not those inside `in (a,b)`."""
    terms, depth, current = [], 0, ""
    for ch in selector:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    return terms


def load_core_api(kubeconfig: str | os.PathLike | None = None) -> Any:
    """A CoreV1Api: from `kubeconfig`, else in-cluster, else the default kubeconfig.
    ValueError with the fix when the client is missing or no configuration is found."""
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise ValueError(MISSING_CLIENT) from None
    try:
        if kubeconfig:
            api_client = config.new_client_from_config(config_file=str(kubeconfig))
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            api_client = client.ApiClient(configuration)
        else:
            api_client = config.new_client_from_config()
    except (ConfigException, OSError) as exc:
        where = kubeconfig or "in-cluster service account or ~/.kube/config"
        raise ValueError(f"Kubernetes client configuration ({where}): {exc}") from None
    return client.CoreV1Api(api_client)


def engine_port(pod: Any, port_name: str) -> int | None:
    """The container port named `port_name` (or that number, if declared) in any container."""
    for container in pod.spec.containers or ():
        for port in container.ports or ():
            if port.name == port_name or (port_name.isdigit() and port.container_port == int(port_name)):
                return int(port.container_port)
    return None


def running_since(pod: Any) -> float | None:
    """When the last of the pod's containers (re)started, if all of them run now."""
    statuses = (pod.status.container_statuses if pod.status else None) or ()
    starts = []
    for status in statuses:
        running = status.state.running if status.state else None
        if running is None or running.started_at is None:
            return None
        starts.append(running.started_at.timestamp())
    return max(starts) if starts else None


def engine_pod(pod: Any, port_name: str) -> EnginePod:
    """An EnginePod from the client's V1Pod."""
    status = pod.status
    conditions = (status.conditions if status else None) or ()
    is_ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    return EnginePod(
        namespace=pod.metadata.namespace,
        name=pod.metadata.name,
        uid=pod.metadata.uid or "",
        node_name=(pod.spec.node_name if pod.spec else None) or "",
        ip=(status.pod_ip if status else None) or None,
        port=engine_port(pod, port_name),
        phase=(status.phase if status else None) or "Unknown",
        is_ready=is_ready,
        is_deleting=pod.metadata.deletion_timestamp is not None,
        started_at=running_since(pod),
    )


class PodDiscovery:
    def __init__(self, config: DiscoveryConfig, api: Any):
        self.config = config
        self.api = api

    def list(self) -> list[EnginePod]:
        """This node's engine pods, sorted by namespace/name. Raises the client's ApiException
        or urllib3's errors when the API server refuses or cannot be reached."""
        c = self.config
        kwargs = {
            "field_selector": c.field_selector,
            "label_selector": c.label_selector,
            "_request_timeout": c.timeout_s,
        }
        if c.namespace:
            result = self.api.list_namespaced_pod(c.namespace, **kwargs)
        else:
            result = self.api.list_pod_for_all_namespaces(**kwargs)
        pods = []
        for item in result.items or ():
            pod = engine_pod(item, c.port_name)
            if pod.node_name != c.node_name:
                log.warning(
                    "the API server listed pod %s of node %r for node %r; ignored", pod.key, pod.node_name, c.node_name
                )
                continue
            if pod.port is None:
                log.warning("engine pod %s declares no container port %r; ignored", pod.key, c.port_name)
                continue
            pods.append(pod)
        return sorted(pods, key=lambda p: p.key)

    def get(self, pod: EnginePod) -> EnginePod | None:
        """The pod as the API server has it now; None when it is gone or is another pod by the same name."""
        from kubernetes.client.exceptions import ApiException

        try:
            item = self.api.read_namespaced_pod(pod.name, pod.namespace, _request_timeout=self.config.timeout_s)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        fresh = engine_pod(item, self.config.port_name)
        return fresh if fresh.uid == pod.uid else None

    def delete(self, pod: EnginePod) -> None:
        """Delete the pod (its own grace period applies), only if it is still that pod:
        the uid precondition keeps a replacement by the same name (a StatefulSet's) alive."""
        from kubernetes import client

        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=pod.uid))
        self.api.delete_namespaced_pod(pod.name, pod.namespace, body=body, _request_timeout=self.config.timeout_s)
