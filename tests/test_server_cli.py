"""`inferd serve` as a process: the default model created under the cache folder, the
admin token from a file, OTLP export, and clean refusals of bad options."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from server_fixtures import OtlpReceiver, child_pids, free_port, serve, stop, wait_healthy

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def test_serve_default_model_token_file_otlp(tmp_path):
    pytest.importorskip(
        "opentelemetry.proto.collector.trace.v1.trace_service_pb2", reason="opentelemetry-proto is missing"
    )
    receiver = OtlpReceiver()
    token_file = tmp_path / "token"
    token_file.write_text("file-token\n")
    port = free_port()
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "INFERD_ADMIN_TOKEN": "env-token"}
    proc = serve(
        [
            "--port",
            str(port),
            "--admin-token-file",
            str(token_file),
            "--max-num-seqs",
            "9",
            "--otlp-endpoint",
            receiver.url,
        ],
        env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
        assert (tmp_path / "cache" / "inferd" / "models" / "tiny" / "config.json").is_file()
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "tiny"
        r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        # The file wins over the environment.
        assert httpx.get(f"{url}/admin/config", headers={"Authorization": "Bearer env-token"}).status_code == 401
        config = httpx.get(f"{url}/admin/config", headers={"Authorization": "Bearer file-token"}).json()["config"]
        assert config["max_num_seqs"] == 9
        metrics = httpx.get(f"{url}/metrics").text
        assert "vllm:num_requests_running{" in metrics
        assert "_created" not in metrics  # as vLLM: no *_created series
    finally:
        stop(proc)
        receiver.close()
    assert proc.returncode in (0, -15)  # uvicorn re-raises SIGTERM after its graceful shutdown
    # The span of the one completion was flushed to the collector at shutdown.
    assert [s.name for s in receiver.spans] == ["llm_request"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-num-seqs", "0"], "max_num_seqs must be in"),
        (["--model", "/nonexistent/model"], "no config.json"),
        (["--port", "70000"], "--port must be in"),
    ],
)
def test_serve_refuses_bad_options(tmp_path, args, message):
    proc = serve(
        args + (["--port", str(free_port())] if "--port" not in args else []),
        {"XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert message in out


def test_tensor_parallel_worker_death_makes_the_server_exit_for_its_supervisor(tiny_model):
    """A dead tensor-parallel worker leaves the engine unusable: the requests in flight get
    an error, /health turns 503, and the process exits with 70 so a supervisor restarts it
    (instead of a live process that fails every request)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve(["--model", tiny_model, "--port", str(port), "--tensor-parallel-size", "2"], {})
    try:
        wait_healthy(proc, url)
        cores = child_pids(proc.pid)  # the engine core process; rank 0 runs there, the workers are its children
        workers = [pid for core in cores for pid in child_pids(core)]
        assert workers, "no tensor-parallel worker process found"
        for pid in workers:
            os.kill(pid, 9)
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "hello", "max_tokens": 4}, timeout=60)
        assert r.status_code >= 500 and "worker" in r.text.lower(), r.text
        assert proc.wait(30) == 70
    finally:
        if proc.poll() is None:
            stop(proc)
