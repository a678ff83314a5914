"""Helpers to run the engine server for tests: a real uvicorn on a loopback port, in a
background thread, with the app built from a model directory and engine options; the
engine core runs in its own process, as under `inferd serve`."""

from __future__ import annotations

import contextlib
import http.server
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from inferd.engine.config import EngineConfig
from inferd.engine.server.app import ServerSettings, create_app
from inferd.engine.server.core_client import EngineCoreClient

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "tiny"
ADMIN_TOKEN = "test-admin-token"


class ServerThread:
    def __init__(self, app, startup_timeout: float = 60.0):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))  # the kernel picks a free port; no race
        self.port = self.sock.getsockname()[1]
        self.app = app
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.startup_timeout = startup_timeout

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait_ready: bool = True) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        # Polled here rather than over HTTP, so no test sees the 503s of its server's start-up.
        while wait_ready and self.app.state.engine.state != "ready":
            if time.monotonic() > deadline or not self.app.state.engine.is_alive:
                raise RuntimeError(f"the engine core did not become ready ({self.app.state.engine.state})")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def build_app(
    model_dir: str,
    admin_token: str | None = ADMIN_TOKEN,
    enable_fault_injection: bool = False,
    max_body_bytes: int = 1 << 20,
    otlp_endpoint: str | None = None,
    engine_factory=None,
    stall_timeout_s: float = 10.0,
    shutdown_timeout_s: float = 30.0,
    slo_classes=None,
    admission=None,
    **engine_options,
):
    client = EngineCoreClient(
        EngineConfig(model=model_dir, **engine_options),
        otlp_endpoint=otlp_endpoint,
        engine_factory=engine_factory,
        stall_timeout_s=stall_timeout_s,
        heartbeat_s=min(1.0, stall_timeout_s / 4),
        torch_num_threads=1,
    )
    settings = ServerSettings(
        served_model_name=MODEL_NAME,
        admin_token=admin_token,
        max_body_bytes=max_body_bytes,
        enable_fault_injection=enable_fault_injection,
        shutdown_timeout_s=shutdown_timeout_s,
    )
    if slo_classes is not None:
        settings.slo_classes = slo_classes
    if admission is not None:
        settings.admission = admission
    return create_app(client, settings)


@contextlib.contextmanager
def running_server(model_dir: str, **options) -> Iterator[ServerThread]:
    server = ServerThread(build_app(model_dir, **options)).start()
    try:
        yield server
    finally:
        server.stop()


def scrape(url: str) -> str:
    response = httpx.get(f"{url}/metrics", timeout=10)
    response.raise_for_status()
    return response.text


def metric_value(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The value of one sample in an exposition (summed over samples matching `labels`)."""
    from prometheus_client.parser import text_string_to_metric_families

    total, found = 0.0, False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                total += sample.value
                found = True
    if not found:
        raise KeyError(f"no sample {name}{labels or ''} in the scrape")
    return total


def admin_headers(token: str = ADMIN_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def one_torch_thread():
    """On two shared cores torch's second intra-op thread spin-waits for a busy core; one
    thread runs the tiny model's steps several times faster. Restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class OtlpReceiver:
    """An OTLP/HTTP trace receiver: stores every span it is sent."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_service

        self.spans = []
        self.paths = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.paths.append(self.path)
                request = trace_service.ExportTraceServiceRequest()
                request.ParseFromString(body)
                for rs in request.resource_spans:
                    for ss in rs.scope_spans:
                        receiver.spans.extend(ss.spans)
                out = trace_service.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


# --- `inferd serve` as a process ---------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "inferd.agent.cli", "serve", "--log-level", "WARNING", *args],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"inferd serve exited with {proc.returncode}: {proc.stdout.read()}")
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("inferd serve did not become ready")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def child_pids(parent: int) -> list[int]:
    """Direct children of `parent`, from /proc (the spawned workers; spawn's resource
    tracker is a child too, and killing it is harmless)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            pids.append(int(stat.parent.name))
    return pids


# --- the live stack's fixed ports -------------------------------------------------------

# One path for the whole machine on purpose: the ports are the machine's, so a second test
# run (or xdist worker) waits here instead of finding them taken.
LIVE_STACK_LOCK = Path(tempfile.gettempdir()) / "inferd-live-stack-ports.lock"


@contextlib.contextmanager
def live_stack_ports(timeout: float = 1800.0) -> Iterator[None]:
    """Hold the live stack's fixed ports (8000, 9090, 9093, 10400) while a test or fixture
    runs `inferd stack up` or the compose stack: an flock, so one holder at a time across
    xdist workers and test runs, released when its process ends even if it crashes."""
    import fcntl

    fd = os.open(LIVE_STACK_LOCK, os.O_RDONLY | os.O_CREAT, 0o666)  # flock needs no write access
    with os.fdopen(fd) as lock:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.skip(
                        f"the live stack's ports stayed held by another test for {timeout:.0f} s ({LIVE_STACK_LOCK})"
                    )
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def assert_error(response: httpx.Response, status: int, *fragments: str, param: str | None = None) -> dict:
    """The response is `status` with a JSON body in the OpenAI error shape whose message holds
    every fragment (and whose param is `param`, when given); returns the error object."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for fragment in fragments:
        assert fragment in error["message"], error["message"]
    if param is not None:
        assert error["param"] == param
    return error
