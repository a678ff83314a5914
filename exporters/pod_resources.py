"""Which pod holds which GPU: the kubelet's pod-resources API (v1 `PodResourcesLister.List`).

The kubelet serves it on a unix socket (/var/lib/kubelet/pod-resources/kubelet.sock),
the same source dcgm-exporter reads for its `pod`, `namespace` and `container` labels.
Device ids in the response are what the device plugin advertised:

- NVIDIA's device plugin: GPU UUIDs (`GPU-...`); with time-slicing or MPS sharing a
  replica suffix (`GPU-...::2`), dropped here so every replica maps to its GPU.
- Some plugins (GKE's): device names (`nvidia0`), matched to the GPU's `device` label.
- MIG slices (`MIG-...`, resource `nvidia.com/mig-*`) are skipped: the GPU collector
  exports whole GPUs.

A GPU shared by several containers is attributed to the first in (namespace, pod,
container) order, so each GPU keeps one series and sums over GPUs stay right.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferd.exporters import pod_resources_api as api

log = logging.getLogger(__name__)

KUBELET_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
GPU_RESOURCE_PREFIX = "nvidia.com/"
POD_LABELS = ["pod", "namespace", "container"]  # dcgm-exporter's names
NO_POD = ("", "", "")


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    """The container a device or process belongs to."""

    namespace: str
    pod: str
    container: str

    def __post_init__(self) -> None:
        if not self.pod or not self.namespace:
            raise ValueError(f"PodRef needs a pod and a namespace, got {self.namespace!r}/{self.pod!r}")

    @property
    def labels(self) -> tuple[str, str, str]:
        """Values for POD_LABELS."""
        return (self.pod, self.namespace, self.container)


def pod_labels(ref: PodRef | None) -> tuple[str, str, str]:
    """POD_LABELS values; empty (absent to Prometheus) for a device no pod holds."""
    return NO_POD if ref is None else ref.labels


def device_key(device_id: str) -> str | None:
    """The GPU a device id names (a UUID or an `nvidiaN` name), or None for MIG slices."""
    base = device_id.split("::", 1)[0].strip()
    if not base or base.startswith("MIG-"):
        return None
    return base


def gpu_owners(response: Any) -> dict[str, PodRef]:
    """GPU UUID or device name -> the container holding it, from a ListPodResourcesResponse."""
    owners: dict[str, PodRef] = {}
    for pod in response.pod_resources:
        if not pod.name or not pod.namespace:
            continue
        for container in pod.containers:
            ref = PodRef(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                if not devices.resource_name.startswith(GPU_RESOURCE_PREFIX) or "mig-" in devices.resource_name:
                    continue
                for device_id in devices.device_ids:
                    key = device_key(device_id)
                    if key is not None and (key not in owners or ref < owners[key]):
                        owners[key] = ref
    return owners


class PodResourcesClient:
    """Calls List on the kubelet socket; one channel, opened on first use."""

    def __init__(self, socket_path: str | Path, timeout_s: float = 2.0):
        if timeout_s <= 0:
            raise ValueError(f"pod-resources timeout must be > 0 s, got {timeout_s}")
        self.socket_path = Path(socket_path)
        self.timeout_s = timeout_s
        self._channel: Any = None
        self._list: Any = None
        self._lock = threading.Lock()

    def _method(self) -> Any:
        import grpc  # type: ignore[import-untyped]

        with self._lock:
            if self._list is None:
                self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
                self._list = self._channel.unary_unary(
                    api.LIST_METHOD,
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=api.ListPodResourcesResponse.FromString,
                )
            return self._list

    def list(self) -> Any:
        """The ListPodResourcesResponse; raises OSError naming the socket on failure."""
        import grpc  # type: ignore[import-untyped]

        try:
            return self._method()(api.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise OSError(f"pod-resources List on {self.socket_path}: {code}: {details}") from None

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._list = None


class PodResources:
    """The GPU owners, asked of the kubelet at most once per `max_age_s` (scrapes of the
    GPU and eBPF collectors share one answer). On failure the last good answer is kept
    no longer than `max_age_s`; `is_up` says whether the latest call succeeded."""

    def __init__(self, client: PodResourcesClient, max_age_s: float = 1.0, clock=time.monotonic):
        if max_age_s < 0:
            raise ValueError(f"pod-resources max age must be >= 0 s, got {max_age_s}")
        self.client = client
        self.max_age_s = max_age_s
        self._clock = clock
        self._owners: dict[str, PodRef] = {}
        self._at: float | None = None
        self.is_up = False
        self.error: str | None = None
        self._lock = threading.Lock()

    def owners(self) -> dict[str, PodRef]:
        with self._lock:
            now = self._clock()
            if self._at is not None and now - self._at < self.max_age_s:
                return self._owners
            try:
                self._owners = gpu_owners(self.client.list())
                self.is_up, self.error = True, None
            except OSError as exc:
                if self.is_up or self.error != str(exc):
                    log.warning("%s", exc)
                self._owners = {}
                self.is_up, self.error = False, str(exc)
            self._at = now
            return self._owners

    def owner_of(self, uuid: str, device: str = "") -> PodRef | None:
        owners = self.owners()
        return owners.get(uuid) or (owners.get(device) if device else None)

    def close(self) -> None:
        self.client.close()


def add_arguments(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=None,
        help=f"label GPU and eBPF series with pod, namespace and container from the kubelet's pod-resources "
        f"API on this socket (with --kubernetes: {KUBELET_SOCKET}; off otherwise)",
    )


def socket_from_args(args: argparse.Namespace) -> Path | None:
    """The socket to read, or None: pod attribution is off outside Kubernetes."""
    socket = getattr(args, "pod_resources_socket", None)
    if socket is not None:
        return Path(socket)
    return KUBELET_SOCKET if getattr(args, "kubernetes", False) else None


def shared(args: argparse.Namespace, extra: dict[str, Any]) -> PodResources | None:
    """One PodResources for every collector of the agent (kept in the agent's extra)."""
    socket = socket_from_args(args)
    if socket is None:
        return None
    if "pod_resources" not in extra:
        try:
            import grpc  # type: ignore[import-untyped]  # noqa: F401
        except ImportError:
            raise ValueError(f"pod attribution ({socket}) needs grpcio: pip install grpcio") from None
        extra["pod_resources"] = PodResources(PodResourcesClient(socket))
    resources: PodResources = extra["pod_resources"]
    return resources


def unique(refs: Iterable[PodRef]) -> PodRef | None:
    """The one container of several device owners, or the first in order when they differ."""
    ordered = sorted(set(refs))
    return ordered[0] if ordered else None
