"""The server around its engine core process: readiness while loading, a stalled or
killed core, graceful drain on SIGTERM, a busy port, and a thousand clients leaving
mid-stream. Signals go to real processes (`inferd serve`, its engine core)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time

import httpx
import pytest

from server_fixtures import (
    MODEL_NAME,
    ServerThread,
    build_app,
    child_pids,
    free_port,
    metric_value,
    running_server,
    scrape,
    serve,
    stop,
    wait_healthy,
)

LONG_STREAM = {
    "model": MODEL_NAME,
    "prompt": "The engine core runs in a process of its own",
    "max_tokens": 1500,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def wait_until(predicate, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def ready_code(url: str) -> str | None:
    """None when ready, else the error code /ready gives."""
    r = httpx.get(f"{url}/ready", timeout=5)
    return None if r.status_code == 200 else r.json()["error"]["code"]


def engine_core_pid(server_pid: int) -> int:
    """The engine core: the server's child that is not multiprocessing's resource tracker."""
    for pid in child_pids(server_pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"resource_tracker" not in f.read():
                return pid
    raise AssertionError("no engine core process found")


def sse_events(response: httpx.Response):
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: ") :]


@contextlib.contextmanager
def serving(tiny_model: str, *args: str):
    """`inferd serve` on the tiny model as a process, ready: (process, url)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve(["--model", tiny_model, "--served-model-name", MODEL_NAME, "--port", str(port), *args], {})
    try:
        wait_healthy(proc, url)
        yield proc, url
    finally:
        if proc.poll() is None:
            stop(proc)


def stream_then(url: str, body: dict, action) -> list[str]:
    """Open a stream, read its first event, run `action()`, then read the rest."""
    with httpx.Client(timeout=120) as client, client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        events = sse_events(response)
        assert json.loads(next(events))["choices"]
        action()
        return list(events)


def slow_engine(config):
    """An engine that takes three seconds to load (built in the engine core process)."""
    from inferd.engine.llm_engine import LLMEngine

    time.sleep(3)
    return LLMEngine(config)


def test_loading_then_ready(tiny_model):
    server = ServerThread(build_app(tiny_model, engine_factory=slow_engine)).start(wait_ready=False)
    try:
        ready = httpx.get(f"{server.url}/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "loading"
        assert ready.headers["retry-after"]
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200  # alive while loading
        early = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=5)
        assert early.status_code == 503 and early.json()["error"]["code"] == "loading"
        wait_until(lambda: ready_code(server.url) is None, 60, "ready")
        done = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
        assert done.status_code == 200
    finally:
        server.stop()


@pytest.mark.slow
def test_sigkill_of_the_engine_core_gives_503_and_the_server_exits(tiny_model):
    with serving(tiny_model) as (proc, url):
        core = engine_core_pid(proc.pid)
        # The stream ends (no hang) with an error event, then [DONE].
        rest = stream_then(url, LONG_STREAM, lambda: os.kill(core, signal.SIGKILL))
        assert rest[-1] == "[DONE]"
        errors = [json.loads(e)["error"] for e in rest[:-1] if '"error"' in e]
        assert errors and errors[-1]["code"] == "engine_dead", rest[-3:]
        after = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
        assert after.status_code == 503 and after.json()["error"]["code"] == "engine_dead"
        assert proc.wait(30) == 70


@pytest.mark.slow
def test_sigstop_of_the_engine_core_turns_ready_to_stalled(tiny_model):
    with serving(tiny_model, "--stall-timeout", "2") as (proc, url):
        core = engine_core_pid(proc.pid)
        os.kill(core, signal.SIGSTOP)
        try:
            assert wait_until(lambda: ready_code(url) == "engine_stalled", 30, "engine_stalled")
            assert httpx.get(f"{url}/health", timeout=5).status_code == 200  # alive, just not ready
        finally:
            os.kill(core, signal.SIGCONT)
        wait_until(lambda: ready_code(url) is None, 30, "ready again")


def test_a_stalled_engine_refuses_new_requests_at_once_with_retry_after(tiny_model):
    server = ServerThread(build_app(tiny_model, stall_timeout_s=1.0)).start()
    engine = server.app.state.engine
    os.kill(engine.core_pid, signal.SIGSTOP)
    try:
        wait_until(lambda: engine.state == "engine_stalled", 30, "engine_stalled")
        ready = httpx.get(f"{server.url}/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "engine_stalled"
        assert ready.headers["retry-after"]
        for path, body in (
            ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": True}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        ):
            # Before, these were admitted and hung: the client's timeout would raise here.
            r = httpx.post(f"{server.url}{path}", json={"model": MODEL_NAME, **body}, timeout=10)
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stalled", (path, r.text)
            assert r.headers["retry-after"]
    finally:
        os.kill(engine.core_pid, signal.SIGCONT)
    try:
        wait_until(lambda: engine.state == "ready", 30, "ready again")
        done = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
        assert done.status_code == 200
    finally:
        server.stop()


@pytest.mark.slow
def test_sigterm_drains_streams_and_exits_zero(tiny_model):
    with serving(tiny_model) as (proc, url):
        refused = {}

        def sigterm_then_try_another():
            proc.send_signal(signal.SIGTERM)
            wait_until(lambda: ready_code(url) == "draining", 10, "draining")
            refused["r"] = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)

        rest = stream_then(url, {**LONG_STREAM, "max_tokens": 300}, sigterm_then_try_another)
        assert refused["r"].status_code == 503 and refused["r"].json()["error"]["code"] == "draining"
        assert int(refused["r"].headers["retry-after"]) > 0
        assert rest[-1] == "[DONE]"
        chunks = [json.loads(e) for e in rest[:-1]]
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] == 300
        assert proc.wait(60) == 0


@pytest.mark.slow
def test_drain_timeout_ends_streams_with_a_final_chunk(tiny_model):
    with serving(tiny_model, "--shutdown-timeout", "1") as (proc, url):
        rest = stream_then(url, {**LONG_STREAM, "max_tokens": 1900}, lambda: proc.send_signal(signal.SIGTERM))
        assert rest[-1] == "[DONE]"
        reasons = [c["choices"][0]["finish_reason"] for c in map(json.loads, rest[:-1]) if c["choices"]]
        assert reasons[-1] == "abort"
        assert proc.wait(60) == 0


def test_busy_port_fails_before_loading(tiny_model):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        proc = serve(["--model", tiny_model, "--served-model-name", MODEL_NAME, "--port", str(port)], {})
        try:
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                stop(proc)
    output = proc.stdout.read()
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in output, output
    assert "engine core" not in output  # nothing was loaded


@pytest.mark.slow
def test_a_thousand_clients_leaving_mid_stream_free_every_block(tiny_model):
    num_clients = 1000
    # 1,500 tokens: a request the server failed to abort would still be running when the
    # blocks are counted, whereas a client slow to hang up (1,000 of them share one thread
    # on a busy machine) is long gone before 1,500 steps.
    request = json.dumps(LONG_STREAM).encode()

    async def leave_mid_stream(port: int, read_first: bool) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(request), request)
        )
        await writer.drain()
        if read_first:  # the stream has started: headers and at least one event
            await reader.readuntil(b"data: ")
        writer.transport.abort()  # an abrupt close (RST), as a crashed client leaves

    async def scenario(port: int) -> None:
        # Half leave after their first event, half before the engine has answered at all.
        await asyncio.gather(*(leave_mid_stream(port, i % 2 == 0) for i in range(num_clients)))

    with running_server(tiny_model, max_num_seqs=256) as server:
        asyncio.run(scenario(server.port))

        def all_free() -> bool:
            text = scrape(server.url)
            return (
                metric_value(text, "inferd_kv_blocks", {"state": "used"}) == 0
                and metric_value(text, "vllm:num_requests_running") == 0
                and metric_value(text, "vllm:num_requests_waiting") == 0
            )

        wait_until(all_free, 120, "every KV block free")
        text = scrape(server.url)
        finished = sum(
            metric_value(text, "vllm:request_success_total", {"finished_reason": r})
            for r in ("abort", "length", "stop")
        )
        # Every stream that started was added and has ended; one dropped before its request
        # was read may never have reached the engine.
        assert num_clients // 2 <= finished <= num_clients
        assert metric_value(text, "vllm:request_success_total", {"finished_reason": "length"}) == 0
        assert ready_code(server.url) is None
