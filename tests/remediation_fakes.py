"""Real small HTTP servers standing in for the engine's admin API and Prometheus' query API.

Used by tests/test_remediation.py and tests/test_webhook.py. They run on loopback in a
thread, so the code under test talks real HTTP through its real clients.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

BOUNDS = {"max_num_seqs": (1, 1024), "max_num_batched_tokens": (16, 1 << 20)}
CHOICES = {
    "kv_cold_dtype": ("none", "int8", "int4"),
    "preemption_mode": ("swap", "recompute"),
    "mode": ("fast", "fallback"),
}


class _Server:
    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeEngine(_Server):
    """GET/PATCH /admin/config, POST /admin/mode with bearer-token auth and bounds (422);
    every answer carries the bounds as the engine's does. `bounds` overrides the ranges of
    BOUNDS (an engine that accepts less).

    Each change request is logged with the audit log's text at the moment it arrived,
    so tests can check the intent was on disk before the engine was touched.
    """

    def __init__(
        self,
        token: str,
        audit_path: Path | None = None,
        bounds: dict[str, tuple[int, int]] | None = None,
        **config: Any,
    ):
        self.token = token
        self.audit_path = audit_path
        self.bounds = {**BOUNDS, **(bounds or {})}
        self.config: dict[str, Any] = {
            "max_num_seqs": 64,
            "max_num_batched_tokens": 2048,
            "kv_cold_dtype": "none",
            "kv_hot_window": 128,
            "swap_space_bytes": 1 << 26,
            "preemption_mode": "swap",
            "mode": "fast",
            **config,
        }
        self.changes: list[dict[str, Any]] = []
        self.fail_next: int | None = None
        super().__init__(_EngineHandler)


class _EngineHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    @property
    def engine(self) -> FakeEngine:
        return self.server.owner  # type: ignore[attr-defined]

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _reply_config(self) -> None:
        engine = self.engine
        bounds: dict[str, Any] = {name: {"min": low, "max": high} for name, (low, high) in engine.bounds.items()}
        bounds.update({name: list(values) for name, values in CHOICES.items()})
        self._reply(200, {"config": dict(engine.config), "bounds": bounds})

    def _authorised(self) -> bool:
        if self.headers.get("Authorization") != f"Bearer {self.engine.token}":
            self._reply(401, {"detail": "bad token"})
            return False
        return True

    def do_GET(self) -> None:
        if not self._authorised():
            return
        if self.path == "/admin/config":
            self._reply_config()
        else:
            self._reply(404, {"detail": "not found"})

    def do_PATCH(self) -> None:
        self._change("/admin/config")

    def do_POST(self) -> None:
        self._change("/admin/mode")

    def _change(self, expected_path: str) -> None:
        if not self._authorised():
            return
        if self.path != expected_path:
            self._reply(404, {"detail": "not found"})
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        engine = self.engine
        audit_text = engine.audit_path.read_text() if engine.audit_path and engine.audit_path.exists() else ""
        engine.changes.append({"path": self.path, "body": body, "audit_at_request": audit_text})
        if engine.fail_next:
            status, engine.fail_next = engine.fail_next, None
            self._reply(status, {"detail": "injected failure"})
            return
        bounds = engine.bounds
        for name, value in body.items():
            if name in bounds and not bounds[name][0] <= value <= bounds[name][1]:
                self._reply(422, {"detail": f"{name} must be in [{bounds[name][0]}, {bounds[name][1]}]"})
                return
            if name in CHOICES and value not in CHOICES[name]:
                self._reply(422, {"detail": f"{name} must be one of {CHOICES[name]}"})
                return
            if name not in bounds and name not in CHOICES and name not in engine.config:
                self._reply(422, {"detail": f"{name} is not tunable"})
                return
        engine.config.update(body)
        self._reply_config()


class FakePrometheus(_Server):
    """/api/v1/query: answers each query containing a key of `series` with the next value
    of that key's list (the last one repeats); unknown queries get an empty vector.
    stddev_over_time(...) queries are answered from the key "stddev" only."""

    def __init__(self, series: dict[str, list[float]] | None = None):
        self.series = series or {}
        self.queries: list[str] = []
        super().__init__(_PrometheusHandler)


class _PrometheusHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        from urllib.parse import parse_qs, urlparse

        prom: FakePrometheus = self.server.owner  # type: ignore[attr-defined]
        url = urlparse(self.path)
        query = parse_qs(url.query).get("query", [""])[0]
        prom.queries.append(query)
        result = []
        # the spread of a target is answered from "stddev" alone, so it takes no value of the target's list
        series = (
            {"stddev": prom.series["stddev"]}
            if query.startswith("stddev_over_time(") and "stddev" in prom.series
            else {}
            if query.startswith("stddev_over_time(")
            else prom.series
        )
        for key, values in series.items():
            if key in query:
                value = values.pop(0) if len(values) > 1 else values[0]
                result.append({"metric": {}, "value": [0, str(value)]})
                break
        data = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class ManualClock:
    def __init__(self, start: float = 1_800_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def alert_payload(
    name: str = "InferdKVCacheThrashing",
    status: str = "firing",
    fingerprint: str = "f00d",
    starts_at: str = "2026-11-29T10:00:00Z",
    **labels: str,
) -> dict[str, Any]:
    """An Alertmanager version-4 notification with one alert."""
    all_labels = {
        "alertname": name,
        "job": "inferd-engine",
        "instance": "127.0.0.1:8000",
        "severity": "warning",
        "remediate": "true",
        **labels,
    }
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="{name}"}}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "inferd-agent",
        "groupLabels": {"alertname": name},
        "commonLabels": all_labels,
        "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:9093",
        "alerts": [
            {
                "status": status,
                "labels": all_labels,
                "annotations": {"summary": "s", "description": "12 KV page faults per second"},
                "startsAt": starts_at,
                "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-29T10:05:00Z",
                "generatorURL": "http://127.0.0.1:9090/graph",
                "fingerprint": fingerprint,
            }
        ],
    }
