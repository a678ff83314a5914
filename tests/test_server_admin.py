"""Admin API: bearer token, bounds (422 naming the bound), all-or-nothing changes,
mode switches, fault injection, and the metrics that show the current values."""

from __future__ import annotations

import httpx
import openai
import pytest

from inferd.engine.server.admin import load_admin_token

from server_fixtures import (
    ADMIN_TOKEN,
    MODEL_NAME,
    admin_headers,
    assert_error,
    metric_value,
    running_server,
    scrape,
)


@pytest.fixture(scope="module")
def server(tiny_model):
    with running_server(tiny_model, enable_fault_injection=True) as s:
        yield s


def admin(server, method: str, path: str, body=None, token: str | None = ADMIN_TOKEN) -> httpx.Response:
    headers = admin_headers(token) if token is not None else {}
    return httpx.request(method, f"{server.url}/admin{path}", json=body, headers=headers, timeout=30)


def greedy_text(server, prompt="The scheduler preempts the newest sequence", max_tokens=16) -> str:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    r = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True}
    )
    return r.choices[0].text


def test_token_required(server):
    r = admin(server, "GET", "/config", token=None)
    assert r.status_code == 401
    assert "admin token" in r.json()["error"]["message"]
    assert admin(server, "GET", "/config", token="wrong").status_code == 401
    assert admin(server, "GET", "/config", token=ADMIN_TOKEN + "x").status_code == 401
    r = httpx.get(f"{server.url}/admin/config", headers={"Authorization": ADMIN_TOKEN})  # no "Bearer"
    assert r.status_code == 401


@pytest.mark.parametrize(
    "header", [f"Bearer {ADMIN_TOKEN}", f"bearer {ADMIN_TOKEN}", f"BEARER {ADMIN_TOKEN}", f"bEaReR   {ADMIN_TOKEN}"]
)
def test_bearer_scheme_in_any_case(server, header):
    # RFC 7235: the scheme is case-insensitive; the webhook of the agent takes the same.
    assert httpx.get(f"{server.url}/admin/config", headers={"Authorization": header}).status_code == 200


@pytest.mark.parametrize(
    "header",
    [
        ADMIN_TOKEN,
        f"Basic {ADMIN_TOKEN}",
        f"Token {ADMIN_TOKEN}",
        f"Bearer{ADMIN_TOKEN}",
        "Bearer",
        f"Bearer {ADMIN_TOKEN.upper()}",
        "",
    ],
)
def test_other_schemes_or_a_missing_scheme_refused(server, header):
    r = httpx.get(f"{server.url}/admin/config", headers={"Authorization": header})
    assert_error(r, 401, "missing or wrong admin token")


SURROGATE = "\\ud800"  # JSON's escape of a lone surrogate: valid JSON, not Unicode text


@pytest.mark.parametrize(
    "method, path, content, fragments, param",
    [
        ("PATCH", "/config", b"", ["not valid JSON"], None),
        ("POST", "/mode", b"", ["not valid JSON"], None),
        ("POST", "/fault", b"", ["not valid JSON"], None),
        ("PATCH", "/config", b'{"max_num_seqs": "\xff"}', ["not valid UTF-8"], None),
        ("POST", "/mode", b"[" * 3000 + b"]" * 3000, ["nests too deeply"], None),
        ("PATCH", "/config", b'"max_num_seqs"', ["must be a JSON object, got str"], None),
        ("POST", "/mode", b"null", ["must be a JSON object, got NoneType"], None),
        ("PATCH", "/config", f'{{"{SURROGATE}": 1}}'.encode(), ["\\ud800 is not a tunable parameter"], None),
        (
            "PATCH",
            "/config",
            f'{{"kv_cold_dtype": "{SURROGATE}"}}'.encode(),
            ["kv_cold_dtype must be one of"],
            "kv_cold_dtype",
        ),
        ("POST", "/mode", f'{{"mode": "{SURROGATE}"}}'.encode(), ["mode must be one of fast, fallback"], "mode"),
        ("POST", "/fault", f'{{"kind": "{SURROGATE}"}}'.encode(), ["kind must be one of fastpath"], "kind"),
        (
            "PATCH",
            "/config",
            b'{"max_num_seqs": 1000000000000000000000000000000}',
            ["must be in [1, 1024]"],
            "max_num_seqs",
        ),  # past what the channel to the engine core carries: a 500 before
        ("PATCH", "/config", b'{"max_num_seqs": 8.5}', ["must be an integer, got 8.5"], "max_num_seqs"),
        ("PATCH", "/config", b'{"max_num_seqs": true}', ["must be an integer, got True"], "max_num_seqs"),
        ("PATCH", "/config", b'{"max_num_seqs": NaN}', ["must be an integer, got nan"], "max_num_seqs"),
        ("PATCH", "/config", b'{"kv_hot_window": [1]}', ["kv_hot_window must be an integer"], "kv_hot_window"),
        ("POST", "/mode", b'{"mode": {"fast": 1}}', ["mode must be one of fast, fallback"], "mode"),
        ("POST", "/mode", b'{"mode": "fast"}' + b"x", ["not valid JSON"], None),
    ],
)
def test_malformed_admin_bodies_get_422_in_the_openai_shape(server, method, path, content, fragments, param):
    r = httpx.request(
        method,
        f"{server.url}/admin{path}",
        content=content,
        timeout=30,
        headers={**admin_headers(), "content-type": "application/json"},
    )
    assert_error(r, 422, *fragments, param=param)


def test_admin_body_content_type_and_size(server):
    before = admin(server, "GET", "/config").json()["config"]
    # The handlers parse JSON whatever the content type says; a body that is not JSON is the 422.
    r = httpx.patch(
        f"{server.url}/admin/config",
        content=b"max_num_seqs=8",
        timeout=30,
        headers={**admin_headers(), "content-type": "application/x-www-form-urlencoded"},
    )
    assert_error(r, 422, "not valid JSON")
    r = httpx.post(
        f"{server.url}/admin/mode",
        content=b'{"mode": "' + b"f" * (2 << 20) + b'"}',
        timeout=30,
        headers={**admin_headers(), "content-type": "application/json"},
    )
    assert_error(r, 413, "larger than the limit")
    assert admin(server, "GET", "/config").json()["config"] == before


def test_a_whole_float_is_an_integer(server):
    # JSON has one number type: 8.0 is the integer JSON Schema (and /openapi.json) calls 8.
    r = admin(server, "PATCH", "/config", {"max_num_seqs": 8.0})
    assert r.status_code == 200, r.text
    assert r.json()["config"]["max_num_seqs"] == 8
    assert admin(server, "PATCH", "/config", {"max_num_seqs": 64}).status_code == 200


def test_unknown_admin_route_and_method(server):
    assert_error(admin(server, "GET", "/nope"), 404, "no route GET /admin/nope")
    r = admin(server, "PUT", "/config", {})
    assert_error(r, 405, "method PUT not allowed")
    assert r.headers["allow"] == "GET, PATCH"


def test_admin_off_without_token(tiny_model):
    with running_server(tiny_model, admin_token=None) as s:
        r = admin(s, "GET", "/config")
        assert r.status_code == 403
        assert "admin API is off" in r.json()["error"]["message"]
        assert admin(s, "PATCH", "/config", {"max_num_seqs": 4}).status_code == 403


def test_get_config(server):
    r = admin(server, "GET", "/config")
    assert r.status_code == 200
    body = r.json()
    assert set(body["config"]) == {
        "max_num_seqs",
        "max_num_batched_tokens",
        "kv_cold_dtype",
        "kv_hot_window",
        "swap_space_bytes",
        "preemption_mode",
        "mode",
    }
    assert body["bounds"]["max_num_seqs"] == {"min": 1, "max": 1024}
    # what runs, beside what was asked: on CPU the portable path, in either mode
    import torch

    if not torch.cuda.is_available():
        assert body["config"]["mode"] == "fast" and body["path"] == "portable"
        assert body["path_reason"].startswith("fast path unavailable: ")


def test_patch_applies_and_metrics_show_it(server):
    r = admin(server, "PATCH", "/config", {"max_num_seqs": 7, "preemption_mode": "recompute"})
    assert r.status_code == 200, r.text
    assert r.json()["config"]["max_num_seqs"] == 7
    assert admin(server, "GET", "/config").json()["config"]["preemption_mode"] == "recompute"
    text = scrape(server.url)
    assert metric_value(text, "inferd_engine_tunable", {"param": "max_num_seqs"}) == 7
    assert metric_value(text, "inferd_engine_preemption_mode", {"mode": "recompute"}) == 1
    assert metric_value(text, "inferd_engine_preemption_mode", {"mode": "swap"}) == 0
    assert admin(server, "PATCH", "/config", {"max_num_seqs": 64, "preemption_mode": "swap"}).status_code == 200


@pytest.mark.parametrize(
    "changes, fragments",
    [
        ({"max_num_seqs": 0}, ["max_num_seqs must be in [1, 1024]"]),
        ({"max_num_seqs": 5000}, ["max_num_seqs must be in [1, 1024]", "5000"]),
        ({"max_num_batched_tokens": 8}, ["max_num_batched_tokens must be in [16,"]),
        ({"preemption_mode": "teleport"}, ["preemption_mode must be one of swap, recompute"]),
        ({"mode": "turbo"}, ["mode must be one of fast, fallback"]),
        ({"block_size": 32}, ["block_size is not a tunable parameter"]),
        ({"max_num_seqs": "8"}, ["max_num_seqs must be an integer"]),
        ({"kv_cold_dtype": "fp8"}, ["kv_cold_dtype must be one of none, int8, int4"]),
        ({}, ["no changes given"]),
    ],
)
def test_patch_out_of_bounds_422(server, changes, fragments):
    before = admin(server, "GET", "/config").json()["config"]
    r = admin(server, "PATCH", "/config", changes)
    assert r.status_code == 422, r.text
    for fragment in fragments:
        assert fragment in r.json()["error"]["message"]
    assert admin(server, "GET", "/config").json()["config"] == before


def test_kv_cold_dtype_switch(server):
    expected = greedy_text(server)
    r = admin(server, "PATCH", "/config", {"kv_cold_dtype": "int8"})
    if r.status_code == 422 and "not supported" in r.text:
        pytest.skip(f"this engine has no cold-KV quantization: {r.json()['error']['message']}")
    assert r.status_code == 200, r.text
    assert metric_value(scrape(server.url), "inferd_engine_kv_cold_dtype", {"dtype": "int8"}) == 1
    assert greedy_text(server)  # still serving
    assert admin(server, "PATCH", "/config", {"kv_cold_dtype": "none"}).status_code == 200
    assert metric_value(scrape(server.url), "inferd_engine_kv_cold_dtype", {"dtype": "none"}) == 1
    assert greedy_text(server) == expected


def test_patch_is_all_or_nothing(server):
    before = admin(server, "GET", "/config").json()["config"]
    r = admin(server, "PATCH", "/config", {"max_num_seqs": 3, "max_num_batched_tokens": 1})
    assert r.status_code == 422
    assert r.json()["error"]["param"] == "max_num_batched_tokens"  # the field at fault, not the first one
    assert admin(server, "GET", "/config").json()["config"] == before


def test_swap_space_beyond_host_memory_refused_and_serving_goes_on(server):
    """Inside the documented bound (1 TiB) but more than this host has: refused before
    anything is allocated, and the engine keeps serving."""
    expected = greedy_text(server)
    before = admin(server, "GET", "/config").json()["config"]
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo").read().splitlines())
    too_big = (int(meminfo["MemTotal"].split()[0]) * 1024) * 2
    r = admin(server, "PATCH", "/config", {"max_num_seqs": 5, "swap_space_bytes": too_big})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == "swap_space_bytes" and "of host memory" in error["message"]
    assert admin(server, "GET", "/config").json()["config"] == before
    assert greedy_text(server) == expected


def test_patch_malformed_body(server):
    r = httpx.patch(f"{server.url}/admin/config", content=b"{nope", headers=admin_headers())
    assert r.status_code == 422
    assert "not valid JSON" in r.json()["error"]["message"]
    assert admin(server, "PATCH", "/config", [1, 2]).status_code == 422


def test_mode_switch_keeps_outputs(server):
    expected = greedy_text(server)
    r = admin(server, "POST", "/mode", {"mode": "fallback"})
    assert r.status_code == 200
    assert r.json()["config"]["mode"] == "fallback"
    assert metric_value(scrape(server.url), "inferd_engine_mode", {"mode": "fallback"}) == 1
    assert greedy_text(server) == expected
    assert admin(server, "POST", "/mode", {"mode": "fast"}).json()["config"]["mode"] == "fast"
    assert metric_value(scrape(server.url), "inferd_engine_mode", {"mode": "fast"}) == 1
    r = admin(server, "POST", "/mode", {"mode": "warp"})
    assert r.status_code == 422
    assert "mode must be one of fast, fallback" in r.json()["error"]["message"]
    assert admin(server, "POST", "/mode", {"mode": "fast", "extra": 1}).status_code == 422


def test_fault_injection_switches_to_fallback_and_serves(server):
    expected = greedy_text(server)
    assert admin(server, "POST", "/mode", {"mode": "fast"}).status_code == 200
    before = scrape(server.url)
    try:
        failures_before = metric_value(before, "inferd_engine_fastpath_failures_total", {"reason": "injected"})
    except KeyError:
        failures_before = 0
    r = admin(server, "POST", "/fault", {"kind": "fastpath"})
    assert r.status_code == 200, r.text
    assert greedy_text(server) == expected  # the failed step was re-run on the portable path
    after = scrape(server.url)
    assert metric_value(after, "inferd_engine_fastpath_failures_total", {"reason": "injected"}) == failures_before + 1
    assert metric_value(after, "inferd_engine_mode", {"mode": "fallback"}) == 1
    assert admin(server, "GET", "/config").json()["config"]["mode"] == "fallback"
    r = admin(server, "POST", "/fault", {"kind": "meteor"})
    assert r.status_code == 422
    admin(server, "POST", "/mode", {"mode": "fast"})


def test_fault_injection_off_by_default(tiny_model):
    with running_server(tiny_model) as s:
        r = admin(s, "POST", "/fault", {"kind": "fastpath"})
        assert r.status_code == 404
        assert "--enable-fault-injection" in r.json()["error"]["message"]


def test_load_admin_token(tmp_path):
    assert load_admin_token(None, env={}) is None
    assert load_admin_token(None, env={"INFERD_ADMIN_TOKEN": "abc"}) == "abc"
    f = tmp_path / "token"
    f.write_text("  s3cret\n")
    assert load_admin_token(f, env={"INFERD_ADMIN_TOKEN": "abc"}) == "s3cret"
    f.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        load_admin_token(f)


def test_agent_engine_client_speaks_this_api(server):
    engine_client = pytest.importorskip("inferd.agent.engine_client", reason="agent.engine_client is not in this tree")
    client = engine_client.EngineClient(server.url, ADMIN_TOKEN)
    try:
        assert client.get_config()["max_num_seqs"] == 64
        assert client.patch_config({"max_num_seqs": 12})["max_num_seqs"] == 12
        assert client.set_mode("fallback")["mode"] == "fallback"
        assert client.set_mode("fast")["mode"] == "fast"
        with pytest.raises(engine_client.EngineError, match="max_num_seqs must be in") as err:
            client.patch_config({"max_num_seqs": 0})
        assert err.value.status == 422
        client.patch_config({"max_num_seqs": 64})
    finally:
        client.close()


def test_slow_swap_fault_is_checked_and_switched_on_and_off(server):
    r = admin(server, "POST", "/fault", {"kind": "slow_swap", "seconds_per_block": 0.001})
    assert r.status_code == 200, r.text
    assert r.json() == {"injected": "slow_swap"}
    for bad in (-0.1, 2, "0.1", True, None):
        body = {"kind": "slow_swap"} if bad is None else {"kind": "slow_swap", "seconds_per_block": bad}
        r = admin(server, "POST", "/fault", body)
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["error"]["param"] == "seconds_per_block"
    assert admin(server, "POST", "/fault", {"kind": "slow_swap", "seconds_per_block": 0}).status_code == 200
    assert greedy_text(server)  # still serves
