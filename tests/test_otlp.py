"""OTLP push: a loopback receiver decodes the real OTLP/HTTP protobuf; receiver down -> drops."""

from __future__ import annotations

import gzip
import http.server
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from prometheus_client.parser import text_string_to_metric_families

from inferd.agent.otlp import OtlpConfig, OtlpPusher
from inferd.exporters.gpu import GpuCollector
from inferd.exporters.gpu_replay import ReplayBackend, load_replay, write_replay
from inferd.exporters.registry import CollectorSet

from fixture_trees import write_host

REPO = Path(__file__).resolve().parent.parent
GPU_FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
# values that legitimately differ between two collections
VOLATILE = ("inferd_collector_duration_seconds", "inferd_otlp_", "inferd_remediation_")
# The scrape endpoint's own process families (client_python's default collectors, as every
# exporter serves them) describe the agent process, not the node, and are not pushed.
SCRAPE_ONLY = ("process_", "python_gc_", "python_info")


class Receiver:
    """An OTLP/HTTP metrics receiver on 127.0.0.1 keeping every decoded request."""

    def __init__(self):
        self.requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = metrics_service_pb2.ExportMetricsServiceRequest()
                request.ParseFromString(body)
                receiver.requests.append(request)
                reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def decoded_points(request) -> dict[tuple[str, tuple], float]:
    """(name as on /metrics, sorted labels) -> value; sums get their `_total` back."""
    points = {}
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                name = metric.name + ("_total" if kind == "sum" else "")
                for point in getattr(metric, kind).data_points:
                    labels = tuple(sorted((a.key, a.value.string_value) for a in point.attributes))
                    value = point.as_double if point.HasField("as_double") else float(point.as_int)
                    points[(name, labels)] = value
    return points


def exposition_points(text: str) -> dict[tuple[str, tuple], float]:
    points = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.endswith("_created"):
                points[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return points


def render(collector_set: CollectorSet) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(collector_set)
    return generate_latest(registry).decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_snapshot_replay(tmp_path: Path) -> Path:
    path = tmp_path / "one.json"
    write_replay(path, load_replay(GPU_FIXTURES / "h200_phases.json")[1:2])
    return path


def test_agent_pushes_every_metric_and_values_match_its_metrics_endpoint(tmp_path):
    receiver = Receiver()
    roots = write_host(tmp_path / "host")
    port = free_port()
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inferd.agent.cli",
            "agent",
            "--no-engine",
            "--port",
            str(port),
            "--gpu-backend",
            f"replay:{single_snapshot_replay(tmp_path)}",
            "--sysfs-root",
            str(roots.sysfs),
            "--procfs-root",
            str(roots.procfs),
            "--no-collector",
            "ebpf",
            "--otlp-endpoint",
            receiver.url,
            "--otlp-interval",
            "0.3",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while len(receiver.requests) < 2 and time.monotonic() < deadline and agent.poll() is None:
            time.sleep(0.1)
        assert len(receiver.requests) >= 2, (
            agent.stderr.read().decode() if agent.poll() is not None else "no OTLP request"
        )
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        receiver.close()
    pushed = decoded_points(receiver.requests[-1])
    scraped = exposition_points(text)
    stable = lambda points: {k: v for k, v in points.items() if not k[0].startswith(VOLATILE)}  # noqa: E731
    assert stable(pushed) == {k: v for k, v in stable(scraped).items() if not k[0].startswith(SCRAPE_ONLY)}
    assert any(name.startswith("process_") for name, _ in scraped)
    names = {name for name, _ in pushed}
    assert {
        "DCGM_FI_PROF_SM_ACTIVE",
        "inferd_pcie_link_width",
        "inferd_numa_stat_pages_total",
        "inferd_collector_up",
        "inferd_otlp_dropped_total",
    } <= names
    resource = {a.key: a.value.string_value for a in receiver.requests[-1].resource_metrics[0].resource.attributes}
    assert resource["service.name"] == "inferd-agent"


def test_pushed_counters_are_cumulative_monotonic_sums(tmp_path):
    receiver = Receiver()
    collectors = CollectorSet([GpuCollector(ReplayBackend(single_snapshot_replay(tmp_path)))])
    pusher = OtlpPusher(OtlpConfig(endpoint=receiver.url, timeout_s=5), [collectors.collect])
    try:
        pusher.collect_once()
        assert pusher.send_one(timeout_s=5)
    finally:
        pusher.stop()
        receiver.close()
    assert pusher.sent == 1 and pusher.dropped == {"queue_full": 0, "export_failed": 0}
    metrics = {m.name: m for m in receiver.requests[0].resource_metrics[0].scope_metrics[0].metrics}
    lanes = metrics["inferd_pcie_lane_errors"]
    assert lanes.WhichOneof("data") == "sum" and lanes.sum.is_monotonic
    assert lanes.sum.aggregation_temporality == 2  # CUMULATIVE
    assert metrics["DCGM_FI_PROF_DRAM_ACTIVE"].WhichOneof("data") == "gauge"


def test_receiver_down_collection_continues_and_drop_counter_rises(tmp_path):
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    collectors = CollectorSet([GpuCollector(ReplayBackend(GPU_FIXTURES / "h200_phases.json"))])
    pusher = OtlpPusher(OtlpConfig(endpoint=closed, interval_s=0.05, queue_size=2, timeout_s=0.5), [collectors.collect])
    collectors.add(pusher)
    for _ in range(5):
        pusher.collect_once()  # no sender running: the queue holds 2, the 3 oldest are dropped
    assert pusher.dropped["queue_full"] == 3
    assert pusher.send_one(timeout_s=1)
    assert pusher.dropped["export_failed"] == 1

    pusher.start()
    try:
        deadline = time.monotonic() + 30
        while pusher.dropped["export_failed"] < 3 and time.monotonic() < deadline:
            scraped = exposition_points(render(collectors))
            assert ("inferd_collector_up", (("collector", "gpu"),)) in scraped  # scrapes keep working
            time.sleep(0.05)
    finally:
        pusher.stop()
    assert pusher.dropped["export_failed"] >= 3
    scraped = exposition_points(render(collectors))
    assert scraped[("inferd_otlp_dropped_total", (("reason", "export_failed"),))] >= 3
    assert scraped[("inferd_otlp_exported_total", ())] == 0


@pytest.mark.parametrize("endpoint, message", [("localhost:4318", "must be an http"), ("ftp://x", "must be an http")])
def test_bad_endpoint_is_refused(endpoint, message):
    with pytest.raises(ValueError, match=message):
        OtlpConfig(endpoint=endpoint)


def test_endpoint_without_path_gets_the_metrics_path():
    assert OtlpConfig(endpoint="http://127.0.0.1:4318").endpoint == "http://127.0.0.1:4318/v1/metrics"
    assert OtlpConfig(endpoint="http://c:4318/custom").endpoint == "http://c:4318/custom"


ENGINE_EXPOSITION = """\
# HELP inferd_kv_page_faults_total KV page faults
# TYPE inferd_kv_page_faults_total counter
inferd_kv_page_faults_total{kind="swap_in"} 7.0
inferd_kv_page_faults_total{kind="recompute"} 2.0
# HELP vllm:kv_cache_usage_perc KV usage
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="tiny"} 0.625
# HELP vllm:prompt_tokens_total prompt tokens
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="tiny"} 1234.0
"""


def test_engine_kv_metrics_go_to_otlp_but_not_to_the_agent_port(tmp_path):
    from inferd.exporters.engine_metrics import EngineMetricsConfig, EngineMetricsReader

    class EngineHandler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = ENGINE_EXPOSITION.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    engine = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EngineHandler)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    receiver = Receiver()
    reader = EngineMetricsReader(EngineMetricsConfig(url=f"http://127.0.0.1:{engine.server_address[1]}/metrics"))
    collectors = CollectorSet([GpuCollector(ReplayBackend(single_snapshot_replay(tmp_path)))])
    pusher = OtlpPusher(OtlpConfig(endpoint=receiver.url, timeout_s=5), [collectors.collect, reader.read])
    try:
        pusher.collect_once()
        assert pusher.send_one(timeout_s=5)
    finally:
        pusher.stop()
        receiver.close()
        engine.shutdown()
        engine.server_close()
    pushed = decoded_points(receiver.requests[0])
    assert pushed[("inferd_kv_page_faults_total", (("kind", "swap_in"),))] == 7.0
    assert pushed[("vllm:kv_cache_usage_perc", (("model_name", "tiny"),))] == 0.625
    assert not any(name.startswith("vllm:prompt_tokens") for name, _ in pushed)  # not a KV family
    assert reader.values()['inferd_kv_page_faults_total{kind="recompute"}'] == 2.0
    assert "inferd_kv_page_faults" not in render(collectors)


def test_unreachable_engine_is_reported_unavailable():
    from inferd.exporters.engine_metrics import EngineMetricsConfig, EngineMetricsReader
    from inferd.exporters.registry import CollectorUnavailable

    reader = EngineMetricsReader(EngineMetricsConfig(url=f"http://127.0.0.1:{free_port()}/metrics", timeout_s=0.5))
    with pytest.raises(CollectorUnavailable, match="unreachable"):
        reader.read()
