"""Both servers against the OpenAPI documents they publish.

schemathesis (`st run`, every check on: what `--checks all` turns on, set in the config
file so that one operation's known exemption can be written beside it) runs every
operation of the engine server and of the agent, once with the bearer token and once
without: no 5xx, no status the document does not list, every response in its documented
schema and content type, schema-invalid bodies refused and valid ones taken, auth
enforced, 405 with Allow for methods a path has not got. Cases per operation are
bounded (`--max-examples`) and the seed fixed, so a run is the same run every time and
the file stays within about two minutes on two cores.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from server_fixtures import ADMIN_TOKEN, REPO_ROOT, free_port, metric_value, running_server, scrape

pytest.importorskip("schemathesis")

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 32  # keeps a schema-valid request's generation short
MAX_EXAMPLES = 12
SEED = 20261202
HOOK_TOKEN = "hook-token-for-schemathesis"

# Rules across fields that JSON Schema does not say (min_tokens <= max_tokens, best_of = n,
# stream_options only with stream, the context length, ...; see engine/server/app.py) make
# some schema-valid generation requests a 400, as do the chat template's rules for /tokenize
# and token ids past the vocabulary for /detokenize; every other operation must take valid data.
ENGINE_CONFIG = """
[checks]
enabled = true

[[operations]]
include-path-regex = "^(/v1/(chat/)?completions|/tokenize|/detokenize)$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "404"]
"""


ALL_CHECKS = """
[checks]
enabled = true
"""


def run_schemathesis(doc: dict, base_url: str, tmp_path: Path, name: str, *args: str, config: str = ALL_CHECKS) -> dict:
    """`st run` over `doc` against `base_url` with every check (`config`; `--checks all` on the
    command line would override an operation's exemption); its JSON report."""
    schema_path, report_path, config_path = (
        tmp_path / f"{name}.{ext}" for ext in ("openapi.json", "report.json", "toml")
    )
    schema_path.write_text(json.dumps(doc))
    config_path.write_text(config)
    command = [
        Path(sys.executable).with_name("schemathesis"),
        "--config-file",
        config_path,
        "run",
        schema_path,
        "--url",
        base_url,
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        str(SEED),
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--report",
        "json",
        "--report-json-path",
        report_path,
        "--no-color",
        *args,
    ]
    started = time.monotonic()
    result = subprocess.run([str(c) for c in command], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    report = json.loads(report_path.read_text())
    print(
        f"{name}: {report['operations']['tested']} operations, {report['test_cases']['generated']} cases, "
        f"{report['test_cases']['unique_failures']} failures in {time.monotonic() - started:.0f} s"
    )
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
    assert report["operations"]["errored"] == 0 and report["errors"] == [], report["errors"]
    return report


# --- the engine server -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tiny_model):
    with running_server(tiny_model, max_model_len=MAX_MODEL_LEN, enable_fault_injection=True) as server:
        yield server


def engine_doc(server) -> dict:
    doc = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
    fuzzed = copy.deepcopy(doc)
    # A valid swap_space_bytes allocates (and zeroes) that much host memory, up to MemAvailable:
    # not on a shared CI machine. The rest of PATCH /admin/config is fuzzed as documented.
    changes = fuzzed["paths"]["/admin/config"]["patch"]["requestBody"]["content"]["application/json"]["schema"]
    del changes["properties"]["swap_space_bytes"]
    return fuzzed


def test_engine_document_lists_every_status(engine):
    doc = httpx.get(f"{engine.url}/openapi.json", timeout=10).json()
    statuses = {
        (method.upper(), path): sorted(op["responses"])
        for path, item in doc["paths"].items()
        for method, op in item.items()
    }
    # A body that is not of the documented types is a 400, as OpenAI and vLLM answer it: no 422
    # but the admin API's own (a value outside its bound).
    generation = ["200", "400", "404", "413", "429", "500", "503"]
    admin = ["200", "401", "403", "413", "500", "503"]
    assert statuses == {
        ("POST", "/v1/completions"): generation,
        ("POST", "/v1/chat/completions"): generation,
        ("GET", "/v1/models"): ["200", "413"],
        ("GET", "/v1/models/{model}"): ["200", "404", "413"],
        ("POST", "/tokenize"): ["200", "400", "404", "413"],
        ("POST", "/detokenize"): ["200", "400", "404", "413"],
        ("GET", "/version"): ["200", "413"],
        ("GET", "/health"): ["200", "413", "503"],
        ("GET", "/ready"): ["200", "413", "503"],
        ("GET", "/metrics"): ["200", "413"],
        ("GET", "/admin/config"): admin,
        ("PATCH", "/admin/config"): sorted(admin + ["422"]),
        ("POST", "/admin/mode"): sorted(admin + ["422"]),
        ("POST", "/admin/fault"): sorted(admin + ["404", "422"]),
    }
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        assert (
            "not a JSON object of the documented types" in doc["paths"][path]["post"]["responses"]["400"]["description"]
        )
    for path in ("/v1/completions", "/v1/chat/completions"):
        (header,) = doc["paths"][path]["post"]["parameters"]
        assert header["name"] == "X-SLO-Class" and header["in"] == "header"
    assert "slo_class" in doc["components"]["schemas"]["CompletionRequest"]["properties"]
    error = {"$ref": "#/components/schemas/Error"}
    for item in doc["paths"].values():
        for op in item.values():
            for code, response in op["responses"].items():
                assert "X-Request-Id" in response["headers"]
                if code >= "400":
                    assert response["content"] == {"application/json": {"schema": error}}
    assert set(doc["components"]["schemas"]["Error"]["properties"]["error"]["required"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    assert "HTTPValidationError" not in doc["components"]["schemas"]  # FastAPI's shape, never sent here
    assert doc["paths"]["/admin/mode"]["post"]["security"] == [{"adminToken": []}]


def test_schemathesis_engine_with_admin_token(engine, tmp_path):
    report = run_schemathesis(
        engine_doc(engine),
        engine.url,
        tmp_path,
        "engine-token",
        "--header",
        f"Authorization: Bearer {ADMIN_TOKEN}",
        config=ENGINE_CONFIG,
    )
    assert report["operations"]["tested"] == 14
    # The generation routes were reached with bodies the engine ran, not only refused.
    for path in ("/v1/completions", "/v1/chat/completions"):
        assert report["valid_rates"][f"POST {path}"]["fuzzing"]["accepted"] > 0


def test_schemathesis_engine_without_admin_token(engine, tmp_path):
    run_schemathesis(
        engine_doc(engine),
        engine.url,
        tmp_path,
        "engine-no-token",
        "--include-path-regex",
        "^/admin/",
        config=ENGINE_CONFIG,
    )


def test_whole_floats_are_integers(engine):
    r = httpx.post(f"{engine.url}/v1/completions", json={"prompt": "Hello", "max_tokens": 2.0}, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("value", [False, "0.5"])
def test_float_fields_refuse_other_types(engine, value):
    r = httpx.post(
        f"{engine.url}/v1/completions", json={"prompt": "Hello", "max_tokens": 2, "min_p": value}, timeout=30
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "min_p"


def test_engine_served_no_5xx_and_still_serves(engine):
    r = httpx.post(f"{engine.url}/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=30)
    assert r.status_code == 200, r.text
    with pytest.raises(KeyError):
        metric_value(scrape(engine.url), "http_requests_total", {"status": "5xx"})


# --- the agent -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    from fixture_trees import write_host

    root = tmp_path_factory.mktemp("agent")
    host = write_host(root / "host")
    (root / "hook-token").write_text(HOOK_TOKEN + "\n")
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inferd.agent.cli",
            "agent",
            "--no-engine",
            "--port",
            str(port),
            "--no-collector",
            "gpu",
            "--no-collector",
            "ebpf",
            "--sysfs-root",
            str(host.sysfs),
            "--procfs-root",
            str(host.procfs),
            "--webhook-token-file",
            str(root / "hook-token"),
            "--audit-log",
            str(root / "audit.jsonl"),
            "--dry-run",
            "--prometheus-url",
            "http://127.0.0.1:9",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise AssertionError(f"the agent exited {process.returncode}: {process.stderr.read()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("the agent did not answer /healthz")
        time.sleep(0.1)
    try:
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def test_agent_document_lists_every_status(agent):
    doc = httpx.get(f"{agent}/openapi.json", timeout=10).json()  # a 500 before: a Response forward reference
    statuses = {
        (method.upper(), path): sorted(op["responses"])
        for path, item in doc["paths"].items()
        for method, op in item.items()
    }
    assert statuses == {
        ("GET", "/metrics"): ["200"],
        ("GET", "/healthz"): ["200"],
        ("GET", "/v1/topology"): ["200", "503"],
        ("POST", "/v1/alerts"): ["200", "400", "401", "413", "500", "503"],
        ("GET", "/v1/actions"): ["200", "422", "503"],
    }
    assert doc["components"]["schemas"]["Error"] == {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string"}},
    }
    assert doc["paths"]["/v1/alerts"]["post"]["security"] == [{"webhookToken": []}]


def test_schemathesis_agent_with_webhook_token(agent, tmp_path):
    doc = httpx.get(f"{agent}/openapi.json", timeout=10).json()
    report = run_schemathesis(doc, agent, tmp_path, "agent-token", "--header", f"Authorization: Bearer {HOOK_TOKEN}")
    assert report["operations"]["tested"] == 5
    assert report["valid_rates"]["POST /v1/alerts"]["fuzzing"]["accepted"] > 0


def test_schemathesis_agent_without_webhook_token(agent, tmp_path):
    doc = httpx.get(f"{agent}/openapi.json", timeout=10).json()
    run_schemathesis(doc, agent, tmp_path, "agent-no-token")
