"""Traces: one span per request with queued/scheduled/first_token/preempted/finished
events, exported over OTLP/HTTP to a receiver on loopback; a collector that never
answers does not hold up serving."""

from __future__ import annotations

import socket
import threading

import openai
import pytest

from inferd.engine.server.tracing import otlp_traces_url

from server_fixtures import MODEL_NAME, OtlpReceiver, one_torch_thread, running_server  # noqa: F401

pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2", reason="opentelemetry-proto is missing")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"


def test_otlp_traces_url():
    assert otlp_traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert otlp_traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert otlp_traces_url("https://c/custom/path") == "https://c/custom/path"
    with pytest.raises(ValueError, match="http"):
        otlp_traces_url("collector:4318")


def test_spans_with_events_reach_the_collector(tiny_model):
    receiver = OtlpReceiver()
    try:
        # A pool of 12 blocks for 6 concurrent requests of ~5 blocks each forces preemption.
        # The engine core exports the spans; stopping the server flushes them.
        with running_server(
            tiny_model, otlp_endpoint=receiver.url, kv_cache_bytes=12 * 8192, swap_space_bytes=0
        ) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
            import concurrent.futures

            prompts = [f"The scheduler preempts the newest sequence number {i} " * 3 for i in range(6)]
            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                results = list(
                    pool.map(
                        lambda p: client.completions.create(
                            model=MODEL_NAME, prompt=p, max_tokens=30, temperature=0, extra_body={"ignore_eos": True}
                        ),
                        prompts,
                    )
                )
            assert all(r.choices[0].finish_reason == "length" for r in results)
            traced = client.completions.create(
                model=MODEL_NAME, prompt="child span", max_tokens=2, extra_headers={"traceparent": TRACEPARENT}
            )
            assert traced.choices[0].finish_reason in ("length", "stop")
    finally:
        receiver.close()
    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}
    spans = [s for s in receiver.spans if s.name == "llm_request"]
    assert len(spans) == 7
    child = [s for s in spans if s.trace_id.hex() == TRACE_ID]
    assert len(child) == 1 and child[0].parent_span_id.hex() == PARENT_SPAN_ID
    spans = [s for s in spans if s.trace_id.hex() != TRACE_ID]
    for span in spans:
        names = [e.name for e in span.events]
        assert names[0] == "queued" and names[-1] == "finished"
        for needed in ("scheduled", "first_token"):
            assert needed in names
        assert names.index("queued") < names.index("scheduled") <= names.index("first_token")
        attrs = {a.key: a.value for a in span.attributes}
        assert attrs["gen_ai.usage.completion_tokens"].int_value == 30
        assert attrs["gen_ai.response.finish_reason"].string_value == "length"
    assert any("preempted" in [e.name for e in s.events] for s in spans), "no span recorded a preemption"


class StuckCollector:
    """A TCP server that accepts OTLP connections, reads the request and never answers:
    a collector that hangs."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.entered = threading.Event()
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            if conn.recv(1):
                self.entered.set()

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_stuck_export_does_not_block_serving(tiny_model):
    collector = StuckCollector()
    try:
        with running_server(tiny_model, otlp_endpoint=collector.url) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30)

            def one(i: int) -> None:
                r = client.completions.create(model=MODEL_NAME, prompt=f"request {i}", max_tokens=4, temperature=0)
                assert r.choices[0].finish_reason in ("length", "stop")

            i = 0
            while not collector.entered.wait(0.01):  # serve until an export is under way (1 s batch delay)
                one(i)
                i += 1
                assert i < 10_000, "no export ever started"
            # The export hangs now (the exporter waits up to its 5 s timeout); serving goes on regardless.
            for j in range(20):
                one(i + j)
            assert collector.held, "the collector saw no connection"
    finally:
        collector.close()
