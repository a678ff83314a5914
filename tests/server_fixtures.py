"""Helpers to run the engine server for tests: a real uvicorn on a loopback port, in a
background thread, with the app built from a model directory and engine options."""
from __future__ import annotations

import contextlib
import http.server
import socket
import threading
import time
from typing import Iterator

import httpx
import pytest
import uvicorn

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.server.app import ServerSettings, create_app
from engine.server.async_engine import AsyncEngine

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

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def build_app(model_dir: str, admin_token: str | None = ADMIN_TOKEN, enable_fault_injection: bool = False,
              max_body_bytes: int = 1 << 20, tracer=None, **engine_options):
    engine = LLMEngine(EngineConfig(model=model_dir, **engine_options))
    async_engine = AsyncEngine(engine, tracer=tracer)
    settings = ServerSettings(served_model_name=MODEL_NAME, admin_token=admin_token, max_body_bytes=max_body_bytes,
                              enable_fault_injection=enable_fault_injection)
    return create_app(async_engine, settings)


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
