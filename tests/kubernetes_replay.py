"""A replay of the Kubernetes API server for the agent's Kubernetes mode (tests only).

`ReplayApiServer` answers the official client's pod calls from the bodies recorded in
tests/fixtures/kubernetes/ (a kube-apiserver's PodList, Pod, Status), checks and records
every request (path, query, bearer token, body), and hands out a kubeconfig pointing at
itself. Used by tests/test_kubernetes_mode.py and tests/test_e2e_kubernetes.py.
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

FIXTURES = Path(__file__).parent / "fixtures" / "kubernetes"
API_TOKEN = "replay-service-account-token"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


class ReplayApiServer:
    """Serves the recorded PodLists by node, one pod, and DELETE; records every request."""

    def __init__(self, pods_by_node: dict[str, list[dict]]):
        self.pods_by_node = pods_by_node
        self.requests: list[dict[str, Any]] = []
        self.ignore_field_selector = False
        self.forbidden = False
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _record(self) -> tuple[list[str], dict[str, list[str]]]:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                owner.requests.append(
                    {
                        "method": self.command,
                        "path": url.path,
                        "query": parse_qs(url.query),
                        "authorization": self.headers.get("Authorization"),
                        "body": body,
                    }
                )
                return url.path.strip("/").split("/"), parse_qs(url.query)

            def do_GET(self) -> None:
                parts, query = self._record()
                if owner.forbidden:
                    return self._reply(403, fixture("status-forbidden.json"))
                # /api/v1/pods or /api/v1/namespaces/NS/pods[/NAME]
                if parts[:3] == ["api", "v1", "pods"] or (len(parts) == 5 and parts[4] == "pods"):
                    items = owner.list_pods(query)
                    if len(parts) == 5:
                        items = [p for p in items if p["metadata"]["namespace"] == parts[3]]
                    return self._reply(200, {**fixture("pods-empty.json"), "items": items})
                if len(parts) == 6 and parts[4] == "pods":
                    pod = owner.find(parts[3], parts[5])
                    return self._reply(200, pod) if pod else self._reply(404, fixture("status-not-found.json"))
                self._reply(404, fixture("status-not-found.json"))

            def do_DELETE(self) -> None:
                parts, _ = self._record()
                pod = owner.find(parts[3], parts[5]) if len(parts) == 6 else None
                if pod is None:
                    return self._reply(404, fixture("status-not-found.json"))
                deleted = copy.deepcopy(pod)
                deleted["metadata"].update(
                    {k: v for k, v in fixture("pod-deleted.json")["metadata"].items() if k.startswith("deletion")}
                )
                for items in owner.pods_by_node.values():
                    items[:] = [p for p in items if p is not pod]
                self._reply(200, deleted)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def list_pods(self, query: dict[str, list[str]]) -> list[dict]:
        everything = [p for items in self.pods_by_node.values() for p in items]
        field = query.get("fieldSelector", [""])[0]
        if self.ignore_field_selector or not field:
            return everything
        assert field.startswith("spec.nodeName="), field
        node = field.partition("=")[2]
        labels = query.get("labelSelector", [""])[0]
        key, _, value = labels.partition("=")
        return [p for p in self.pods_by_node.get(node, []) if p["metadata"]["labels"].get(key) == value]

    def find(self, namespace: str, name: str) -> dict | None:
        for items in self.pods_by_node.values():
            for pod in items:
                if pod["metadata"]["namespace"] == namespace and pod["metadata"]["name"] == name:
                    return pod
        return None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "replay", "cluster": {"server": self.url}}],
                    "users": [{"name": "agent", "user": {"token": API_TOKEN}}],
                    "contexts": [{"name": "replay", "context": {"cluster": "replay", "user": "agent"}}],
                    "current-context": "replay",
                }
            )
        )
        return path

    def deletes(self) -> list[dict]:
        return [r for r in self.requests if r["method"] == "DELETE"]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def point_at(pod: dict, port: int) -> dict:
    """The recorded pod, its IP and engine port rewritten to an engine on loopback."""
    pod = copy.deepcopy(pod)
    pod["status"]["podIP"] = "127.0.0.1"
    pod["status"]["podIPs"] = [{"ip": "127.0.0.1"}]
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = port
    return pod
