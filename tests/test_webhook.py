"""The Alertmanager webhook and /v1/actions, through HTTP, against a fake engine admin API."""

from __future__ import annotations

import json
import logging
import os

import pytest
from fastapi.testclient import TestClient

from inferd.agent.audit import AuditLog
from inferd.agent.engine_client import EngineClient
from inferd.agent.remediation import PolicyConfig, RemediationPolicy
from inferd.agent.server import AgentState, create_app
from inferd.agent.webhook import MAX_BODY_BYTES, PayloadError, make_webhook_router, parse_notification

from remediation_fakes import FakeEngine, ManualClock, alert_payload

ADMIN_TOKEN = "admin-secret"
HOOK_TOKEN = "hook-secret"


@pytest.fixture
def setup(tmp_path):
    audit_path = tmp_path / "audit.jsonl"
    engine = FakeEngine(ADMIN_TOKEN, audit_path)
    token_file = tmp_path / "webhook-token"
    token_file.write_text(HOOK_TOKEN + "\n")
    clock = ManualClock()

    def make_client(**settings):
        policy = RemediationPolicy(
            EngineClient(engine.url, ADMIN_TOKEN),
            AuditLog(audit_path, clock),
            PolicyConfig(**settings),
            metrics=None,
            clock=clock,
        )
        # The agent's app, as agent.main builds it: its error handlers are part of what is tested.
        state = AgentState.with_collectors([])
        app = create_app(state, [make_webhook_router(state, policy, token_file)])
        return TestClient(app), policy

    yield engine, make_client, token_file, audit_path
    engine.close()


def post(client, payload, token=HOOK_TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    body = payload if isinstance(payload, (str, bytes)) else json.dumps(payload)
    return client.post("/v1/alerts", content=body, headers={**headers, "Content-Type": "application/json"})


def test_right_token_acts(setup):
    engine, make_client, _, _ = setup
    client, _ = make_client()
    response = post(client, alert_payload())
    assert response.status_code == 200
    [result] = response.json()["results"]
    assert (result["result"], result["action"], result["new"]) == (
        "applied",
        "lower_max_num_seqs",
        {"max_num_seqs": 48},
    )
    assert engine.config["max_num_seqs"] == 48


@pytest.mark.parametrize("token", [None, "wrong", "", "hook-secre", "hook-secret-and-more"])
def test_wrong_or_missing_token_gets_401_and_no_action(setup, token):
    engine, make_client, _, audit_path = setup
    client, _ = make_client()
    response = post(client, alert_payload(), token=token)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert engine.changes == []
    assert not audit_path.exists()


def assert_agent_error(response, status: int, fragment: str = "") -> str:
    """The agent's one error shape: {"error": "<message>"}, as JSON."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["error"] and isinstance(body["error"], str)
    assert fragment in body["error"]
    return body["error"]


@pytest.mark.parametrize(
    "header", [f"Bearer {HOOK_TOKEN}", f"bearer {HOOK_TOKEN}", f"BEARER {HOOK_TOKEN}", f"bEaReR   {HOOK_TOKEN}"]
)
def test_bearer_scheme_in_any_case(setup, header):
    # RFC 7235: the auth scheme is case-insensitive (the engine's admin API takes it so too).
    _, make_client, _, _ = setup
    client, _ = make_client()
    response = client.post(
        "/v1/alerts",
        content=json.dumps(alert_payload()),
        headers={"Authorization": header, "Content-Type": "application/json"},
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "header",
    [
        HOOK_TOKEN,
        f"Basic {HOOK_TOKEN}",
        f"Token {HOOK_TOKEN}",
        f"Bearer{HOOK_TOKEN}",
        "Bearer",
        f"Bearer {HOOK_TOKEN.upper()}",
        f"{HOOK_TOKEN} Bearer",
    ],
)
def test_other_schemes_or_a_missing_scheme_refused(setup, header):
    engine, make_client, _, _ = setup
    client, _ = make_client()
    response = client.post(
        "/v1/alerts",
        content=json.dumps(alert_payload()),
        headers={"Authorization": header, "Content-Type": "application/json"},
    )
    assert_agent_error(response, 401, "missing or wrong bearer token")
    assert engine.changes == []


def test_token_file_is_reread_when_it_changes(setup):
    engine, make_client, token_file, _ = setup
    client, _ = make_client()
    token_file.write_text("rotated-token-of-another-length")
    assert post(client, alert_payload()).status_code == 401
    assert post(client, alert_payload(), token="rotated-token-of-another-length").status_code == 200


@pytest.mark.parametrize(
    "payload, message",
    [
        ("{not json", "malformed"),
        ([], "body must be a JSON object"),
        ({**alert_payload(), "version": "3"}, "unsupported payload version '3'"),
        ({**alert_payload(), "alerts": {}}, "alerts must be a list"),
        ({**alert_payload(), "alerts": [{**alert_payload()["alerts"][0], "status": "pending"}]}, "alerts[0].status"),
        ({**alert_payload(), "alerts": [{**alert_payload()["alerts"][0], "fingerprint": ""}]}, "alerts[0].fingerprint"),
        (
            {**alert_payload(), "alerts": [{**alert_payload()["alerts"][0], "labels": {"severity": "x"}}]},
            "include alertname",
        ),
        ({**alert_payload(), "alerts": [{**alert_payload()["alerts"][0], "labels": {"alertname": 3}}]}, "map strings"),
    ],
)
def test_malformed_body_gets_400_and_no_action(setup, payload, message):
    engine, make_client, _, _ = setup
    client, _ = make_client()
    response = post(client, payload)
    assert response.status_code == 400
    assert message in response.json()["error"]
    assert engine.changes == []


def raw_json(payload) -> bytes:
    # json.dumps writes a lone surrogate as the \\ud800 escape: valid JSON, not valid Unicode.
    return json.dumps(payload).encode()


@pytest.mark.parametrize(
    "payload, message",
    [
        (alert_payload("Inferd\ud800Thrashing"), "alerts[0].labels.alertname is not valid Unicode text"),
        (alert_payload(**{"team\udfff": "x"}), "alerts[0].labels is not valid Unicode text"),
        (alert_payload(fingerprint="f\ud800"), "alerts[0].fingerprint is not valid Unicode text"),
        (
            {**alert_payload(), "alerts": [{**alert_payload()["alerts"][0], "annotations": {"summary": "\ud800"}}]},
            "alerts[0].annotations.summary",
        ),
    ],
)
def test_surrogate_strings_get_400_and_are_never_logged(setup, payload, message):
    engine, make_client, _, audit_path = setup
    client, _ = make_client()
    response = post(client, raw_json(payload))
    assert response.status_code == 400
    assert message in response.json()["error"]
    assert engine.changes == []
    assert not audit_path.exists()
    assert client.get("/v1/actions").status_code == 200


@pytest.mark.parametrize("body", [b'{"version": "4", "alerts": "\xff\xfe"}', b"[" * 10000 + b"]" * 10000])
def test_undecodable_or_deep_body_gets_400(setup, body):
    _, make_client, _, _ = setup
    client, _ = make_client()
    response = post(client, body)
    assert response.status_code == 400
    assert "malformed Alertmanager payload" in response.json()["error"]


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b"", "Expecting value"),
        (b"   ", "Expecting value"),
        (b"null", "body must be a JSON object"),
        (b'"4"', "body must be a JSON object"),
        (b'{"version": 4, "alerts": []}', "unsupported payload version 4"),
        (b'{"version": "4", "alerts": [[]]}', "alerts[0] must be an object"),
        (b'{"version": "4", "alerts": [{"status": true}]}', "alerts[0].status must be firing or resolved"),
        (b'{"version": "4", "alerts": [{"status": "firing", "labels": ["alertname"]}]}', "alerts[0].labels"),
        (
            json.dumps({**alert_payload(), "alerts": [{**alert_payload()["alerts"][0], "annotations": []}]}).encode(),
            "alerts[0].annotations must map strings to strings",
        ),
        (
            json.dumps({**alert_payload(), "alerts": [{**alert_payload()["alerts"][0], "startsAt": 5}]}).encode(),
            "alerts[0].startsAt must be a non-empty string",
        ),
        (b'{"version": "4", "alerts": [], "x": ' + b"9" * 5000 + b"}", "malformed"),  # past int()'s digit limit
        (b'{"version": "4", "alerts": []}trailing', "Extra data"),
    ],
)
def test_every_malformed_body_is_a_400_in_the_agent_shape(setup, body, fragment):
    engine, make_client, _, _ = setup
    client, _ = make_client()
    message = assert_agent_error(post(client, body), 400, fragment)
    assert message.startswith("malformed Alertmanager payload: ")
    assert engine.changes == []


def test_the_content_type_is_not_what_decides(setup):
    # Alertmanager sends application/json; what is parsed is the body, whatever the header says.
    _, make_client, _, _ = setup
    client, _ = make_client()
    headers = {"Authorization": f"Bearer {HOOK_TOKEN}"}
    ok = client.post(
        "/v1/alerts", content=json.dumps(alert_payload()), headers={**headers, "Content-Type": "text/plain"}
    )
    assert ok.status_code == 200, ok.text
    form = client.post("/v1/alerts", data={"version": "4"}, headers=headers)
    assert_agent_error(form, 400, "malformed Alertmanager payload")


def test_a_huge_body_is_a_413_in_the_agent_shape(setup):
    engine, make_client, _, _ = setup
    client, _ = make_client()
    assert_agent_error(post(client, b"[" * (MAX_BODY_BYTES + 1)), 413, f"body over {MAX_BODY_BYTES} bytes")

    def chunks():  # no Content-Length: the limit holds while reading
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536

    response = client.post(
        "/v1/alerts",
        content=chunks(),
        headers={"Authorization": f"Bearer {HOOK_TOKEN}", "Content-Type": "application/json"},
    )
    assert_agent_error(response, 413, "body over")
    assert engine.changes == []


def test_routing_and_query_errors_are_in_the_agent_shape(setup):
    _, make_client, _, _ = setup
    client, _ = make_client()
    assert_agent_error(client.get("/v1/nope"), 404, "no route GET /v1/nope")
    response = client.get("/v1/alerts")
    assert_agent_error(response, 405, "method GET not allowed on /v1/alerts")
    assert response.headers["allow"] == "POST"
    assert_agent_error(client.get("/v1/actions?limit=many"), 422, "limit: Input should be a valid integer")
    assert_agent_error(client.get("/v1/actions?limit=100001"), 422, "limit: Input should be less than or equal")


def test_an_unreadable_audit_log_is_a_503_in_the_agent_shape(setup, monkeypatch):
    _, make_client, _, _ = setup
    client, policy = make_client()

    def unreadable(limit):
        raise PermissionError("permission denied")

    monkeypatch.setattr(policy.audit, "tail", unreadable)
    assert_agent_error(client.get("/v1/actions"), 503, "audit log unreadable: permission denied")


def test_a_failing_policy_is_a_500_in_the_agent_shape(setup, monkeypatch):
    _, make_client, _, _ = setup
    client, policy = make_client()
    monkeypatch.setattr(policy, "handle", lambda alert: 1 / 0)
    client = TestClient(client.app, raise_server_exceptions=False)
    assert_agent_error(post(client, alert_payload()), 500, "internal error: ZeroDivisionError")


def test_a_bad_record_in_the_audit_log_does_not_break_actions(setup):
    engine, make_client, _, audit_path = setup
    client, _ = make_client()
    post(client, alert_payload())
    # What an older agent could have logged: a lone surrogate and a NaN.
    with open(audit_path, "a") as fh:
        fh.write('{"ts": 1, "event": "alert", "alert": "Bad\\ud800Alert", "value": NaN}\n')
    client, _ = make_client()  # a restarted agent: /v1/actions answers what it read on start
    response = client.get("/v1/actions")
    assert response.status_code == 200
    records = response.json()["records"]
    assert [r["event"] for r in records] == ["alert", "decision", "applied", "episode_ended", "alert"]
    assert (records[-1]["alert"], records[-1]["value"]) == ("Bad\\ud800Alert", "nan")


def test_replaying_the_same_notification_acts_once(setup):
    engine, make_client, _, _ = setup
    client, _ = make_client(cooldown_s=0)
    first = post(client, alert_payload()).json()["results"][0]["result"]
    second = post(client, alert_payload()).json()["results"][0]["result"]
    assert (first, second) == ("applied", "duplicate")
    assert len(engine.changes) == 1
    # Its resolution is a different event, and is not an action.
    resolved = post(client, alert_payload(status="resolved")).json()["results"][0]
    assert resolved["result"] == "restore_scheduled"  # the change goes back once it stays resolved
    assert len(engine.changes) == 1


def test_replay_after_an_agent_restart_still_acts_once(setup):
    engine, make_client, _, _ = setup
    client, _ = make_client(cooldown_s=0)
    post(client, alert_payload())
    restarted, _ = make_client(cooldown_s=0)
    assert post(restarted, alert_payload()).json()["results"][0]["result"] == "duplicate"
    assert len(engine.changes) == 1


def test_unknown_alert_is_ignored_and_logged(setup, caplog):
    engine, make_client, _, _ = setup
    client, _ = make_client()
    with caplog.at_level(logging.INFO):
        response = post(client, alert_payload("SomebodyElsesAlert"))
    assert response.status_code == 200
    assert response.json()["results"][0]["result"] == "ignored"
    assert "no remediation rule for alert 'SomebodyElsesAlert'" in caplog.text
    assert engine.changes == []


def test_actions_lists_the_audit_log(setup):
    engine, make_client, _, _ = setup
    client, _ = make_client()
    post(client, alert_payload())
    body = client.get("/v1/actions").json()
    assert [r["event"] for r in body["records"]] == ["alert", "decision", "applied", "episode_ended"]
    applied = body["records"][-2]
    assert (applied["alert"], applied["old"], applied["new"]) == (
        "InferdKVCacheThrashing",
        {"max_num_seqs": 64},
        {"max_num_seqs": 48},
    )
    assert [r["event"] for r in client.get("/v1/actions?limit=1").json()["records"]] == ["episode_ended"]
    assert client.get("/v1/actions?limit=-1").status_code == 422


def test_dry_run_through_the_webhook(setup):
    engine, make_client, _, _ = setup
    client, _ = make_client(dry_run=True)
    result = post(client, alert_payload()).json()["results"][0]
    assert result["result"] == "dry_run"
    assert engine.changes == []
    assert client.get("/v1/actions").json()["dry_run"] is True


def test_missing_token_file_fails_at_start(tmp_path, setup):
    _, _, _, audit_path = setup
    policy = RemediationPolicy(None, AuditLog(audit_path))
    with pytest.raises(FileNotFoundError):
        make_webhook_router(AgentState.with_collectors([]), policy, tmp_path / "nope")


def test_parse_notification_reads_every_alert():
    payload = alert_payload()
    payload["alerts"].append({**payload["alerts"][0], "fingerprint": "beef", "status": "resolved"})
    alerts = parse_notification(payload)
    assert [(a.name, a.status, a.fingerprint) for a in alerts] == [
        ("InferdKVCacheThrashing", "firing", "f00d"),
        ("InferdKVCacheThrashing", "resolved", "beef"),
    ]
    with pytest.raises(PayloadError):
        parse_notification({"version": "4"})


def test_agent_hook_builds_the_policy_from_the_agent_arguments(setup, tmp_path, monkeypatch):
    import argparse

    from inferd.agent.remediation import RemediationCollector
    from inferd.agent.server import AgentState, create_app
    from inferd.agent.webhook import add_arguments, make_router

    engine, _, token_file, _ = setup
    admin_file = tmp_path / "admin-token"
    admin_file.write_text(ADMIN_TOKEN)
    (tmp_path / "policy.yml").write_text("cooldown_s: 5\nverify_window_s: 1\n")
    monkeypatch.setenv("INFERD_ADMIN_TOKEN", "restored-after-the-test")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--webhook-token-file",
            str(token_file),
            "--audit-log",
            str(tmp_path / "hook-audit.jsonl"),
            "--admin-token-file",
            str(admin_file),
            "--remediation-config",
            str(tmp_path / "policy.yml"),
            "--prometheus-url",
            "http://127.0.0.1:9",
        ]
    )
    state = AgentState.with_collectors([], engine_url=engine.url)
    state.extra["args"] = args
    client = TestClient(create_app(state, [make_router(state)]))
    policy = state.extra["remediation"]
    state.collectors.add(RemediationCollector(policy))  # what the agent's `remediation` collector entry builds
    try:
        assert policy.config.cooldown_s == 5
        assert os.environ["INFERD_ADMIN_TOKEN"] == ADMIN_TOKEN  # what a supervised engine inherits
        assert post(client, alert_payload()).json()["results"][0]["result"] == "applied"
        assert engine.config["max_num_seqs"] == 48
        metrics = client.get("/metrics").text
        assert (
            'inferd_remediation_actions_total{action="lower_max_num_seqs",alert="InferdKVCacheThrashing",result="applied"} 1.0'
            in metrics
        )
        assert [r["event"] for r in client.get("/v1/actions").json()["records"]] == [
            "alert",
            "decision",
            "applied",
            "episode_ended",
        ]  # no Prometheus answered: unverified
    finally:
        policy.stop()


def test_agent_hook_without_a_token_file_refuses_every_call(setup, tmp_path):
    import argparse

    from inferd.agent.server import AgentState, create_app
    from inferd.agent.webhook import add_arguments, make_router

    engine, _, _, _ = setup
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--audit-log", str(tmp_path / "a.jsonl"), "--dry-run"])
    state = AgentState.with_collectors([], engine_url=engine.url)
    state.extra["args"] = args
    client = TestClient(create_app(state, [make_router(state)]))
    try:
        assert post(client, alert_payload()).status_code == 401
        assert state.extra["remediation"].config.dry_run is True
    finally:
        state.extra["remediation"].stop()
