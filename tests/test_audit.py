"""The audit log under a full disk, a torn tail, a read-only path and rotation; the
webhook's 503 when it cannot record; GET /v1/actions answered from memory.

A full disk is simulated without root: os.write writes part of the line, then raises
ENOSPC, as write(2) does when the filesystem fills mid-record."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from inferd.agent.audit import AuditLog, AuditLogConfig, AuditLogError, AuditWriteError
from inferd.agent.engine_client import EngineClient
from inferd.agent.remediation import Alert, PolicyConfig, RemediationPolicy
from inferd.agent.server import AgentState, create_app
from inferd.agent.webhook import make_webhook_router

from remediation_fakes import FakeEngine, ManualClock, alert_payload
from server_fixtures import free_port

REPO = Path(__file__).resolve().parent.parent
ADMIN_TOKEN = "admin-secret"
HOOK_TOKEN = "hook-secret"


class FullDisk:
    """os.write that writes `room` more bytes, then fails with ENOSPC."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, room: int = 10):
        self.room = room
        self._real = os.write
        self._monkeypatch = monkeypatch
        monkeypatch.setattr(os, "write", self)

    def __call__(self, fd: int, data) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = self._real(fd, bytes(data[: self.room]))
        self.room -= written
        return written

    def free(self) -> None:
        self._monkeypatch.setattr(os, "write", self._real)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---- appends are whole records or nothing ----


def test_a_full_disk_mid_record_leaves_nothing_and_the_next_record_is_whole(tmp_path, monkeypatch):
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    audit.append("alert", fingerprint="a", status="firing")
    before = path.read_bytes()
    disk = FullDisk(monkeypatch, room=10)
    with pytest.raises(AuditWriteError, match=rf"cannot append to the audit log {path}: .*No space left on device"):
        audit.append("alert", fingerprint="b", status="firing")
    assert path.read_bytes() == before  # the 10 bytes that went out were taken back
    disk.free()
    audit.append("alert", fingerprint="c", status="firing")
    assert [r["fingerprint"] for r in lines(path)] == ["a", "c"]
    assert [r["fingerprint"] for r in audit.tail(0)] == ["a", "c"]


def test_a_failed_fsync_takes_the_record_back(tmp_path, monkeypatch):
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    audit.append("alert", fingerprint="a", status="firing")
    before = path.read_bytes()
    real_fsync = os.fsync
    failures = iter([OSError(errno.EIO, os.strerror(errno.EIO))])

    def failing_fsync(fd: int) -> None:
        error = next(failures, None)
        if error is not None:
            raise error
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(AuditWriteError, match="Input/output error"):
        audit.append("decision", id="x")
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "tail, kept",
    [
        ('{"ts": 1, "event": "deci', ["a", "b"]),  # a torn write: cut off
        ('{"ts":1,"event":"alert","fingerprint":"t"}', ["a", "t", "b"]),  # whole but for its newline: kept
    ],
)
def test_a_torn_tail_is_repaired_before_the_next_append(tmp_path, tail, kept):
    path = tmp_path / "audit.jsonl"
    AuditLog(path).append("alert", fingerprint="a")
    with open(path, "a") as fh:
        fh.write(tail)  # what a crash mid-write leaves
    audit = AuditLog(path)
    audit.append("alert", fingerprint="b")
    assert [r["fingerprint"] for r in audit.read()] == kept
    assert audit.unreadable_lines == 0


def test_unreadable_lines_are_skipped_and_counted_and_their_neighbours_kept(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_text(
        '{"ts":1,"event":"alert","fingerprint":"a"}\nnot json\n[1]\n{"ts":2,"event":"alert","fingerprint":"b"}\n'
    )
    audit = AuditLog(path)
    assert [r["fingerprint"] for r in audit.read()] == ["a", "b"]
    assert audit.unreadable_lines == 2


# ---- start-up ----


def test_a_read_only_audit_path_fails_at_start(tmp_path, monkeypatch):
    path = tmp_path / "audit.jsonl"
    real_open = os.open

    def read_only_open(file, flags, *args, **kwargs):
        if Path(file) == path and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only_open)
    with pytest.raises(AuditLogError, match=f"audit log {path} is not writable: .*Read-only file system"):
        AuditLog(path)


def test_an_unused_audit_log_leaves_no_file(tmp_path):
    AuditLog(tmp_path / "audit.jsonl")
    assert list(tmp_path.iterdir()) == []


def test_the_agent_refuses_to_start_on_an_audit_log_it_cannot_append_to(tmp_path):
    unwritable = "/proc/audit.jsonl"  # procfs makes no new files, for root too
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "inferd.agent.cli",
            "agent",
            "--no-engine",
            "--port",
            str(free_port()),
            "--sysfs-root",
            str(tmp_path),
            "--audit-log",
            unwritable,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert f"inferd agent: remediation: audit log {unwritable} is not writable" in result.stderr


# ---- rotation ----


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"max_bytes": 1000}, "max_bytes must be at least 65536"),
        ({"keep_files": 0}, "keep_files must be 1..100"),
        ({"recent_records": 0}, "recent_records must be 1..1000000"),
    ],
)
def test_audit_log_config_is_checked(settings, message):
    with pytest.raises(ValueError, match=message):
        AuditLogConfig(**settings)


def test_the_log_rotates_at_its_size_and_keeps_what_deduplication_needs(tmp_path):
    path = tmp_path / "audit.jsonl"
    clock = ManualClock()
    config = AuditLogConfig(max_bytes=64 << 10, keep_files=2)
    policy = RemediationPolicy(None, AuditLog(path, clock, config), PolicyConfig(dry_run=True), clock=clock)
    still_firing = Alert("firing", {"alertname": "SomebodyElsesAlert"}, {}, "2026-01-01T00:00:00Z", "old-fp")
    gone = Alert("firing", {"alertname": "SomebodyElsesAlert"}, {}, "2026-01-01T00:00:00Z", "gone-fp")
    assert policy.handle(still_firing)["result"] == "ignored"
    policy.handle(gone)
    policy.handle(Alert("resolved", gone.labels, {}, gone.starts_at, gone.fingerprint))
    for number in range(400):  # about 4 files' worth: the first ones are deleted
        policy.audit.append("note", number=number, padding="x" * 600)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    assert all(p.stat().st_size <= config.max_bytes for p in tmp_path.iterdir())
    numbers = [r["number"] for r in policy.audit.read() if r["event"] == "note"]
    assert numbers == list(range(numbers[0], 400)) and numbers[0] > 0

    restarted = RemediationPolicy(None, AuditLog(path, clock, config), PolicyConfig(dry_run=True), clock=clock)
    assert restarted.handle(still_firing)["result"] == "duplicate"
    assert [r["fingerprint"] for r in restarted.audit.read() if r.get("carried")] == ["old-fp"] * 3
    assert "old-fp" not in [r.get("fingerprint") for r in restarted.audit.tail(0)]  # copies are not listed


# ---- the webhook and /v1/actions ----


@pytest.fixture
def agent(tmp_path):
    audit_path = tmp_path / "audit.jsonl"
    engine = FakeEngine(ADMIN_TOKEN, audit_path)
    token_file = tmp_path / "webhook-token"
    token_file.write_text(HOOK_TOKEN)
    clock = ManualClock()

    def start(**audit_settings) -> TestClient:
        audit = AuditLog(audit_path, clock, AuditLogConfig(**audit_settings))
        policy = RemediationPolicy(EngineClient(engine.url, ADMIN_TOKEN), audit, PolicyConfig(), clock=clock)
        state = AgentState.with_collectors([])
        app = create_app(state, [make_webhook_router(state, policy, token_file)])
        return TestClient(app)

    yield engine, start, audit_path
    engine.close()


def post(client: TestClient, payload):
    headers = {"Authorization": f"Bearer {HOOK_TOKEN}", "Content-Type": "application/json"}
    return client.post("/v1/alerts", content=json.dumps(payload), headers=headers)


def test_a_full_disk_answers_503_naming_the_audit_log_and_the_retry_is_handled_once(agent, monkeypatch):
    engine, start, audit_path = agent
    client = start()
    disk = FullDisk(monkeypatch, room=25)
    response = post(client, alert_payload(fingerprint="a"))
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "60"
    message = response.json()["error"]
    assert f"cannot append to the audit log {audit_path}" in message and "No space left on device" in message
    assert "alerts[0] and any after it were not handled" in message
    assert engine.changes == []  # never acted unaudited
    assert not audit_path.exists() or audit_path.read_text() == ""

    disk.free()  # Alertmanager retries the same notification
    assert post(client, alert_payload(fingerprint="a")).json()["results"][0]["result"] == "applied"
    assert len(engine.changes) == 1
    assert [r["fingerprint"] for r in lines(audit_path) if r["event"] == "alert"] == ["a"]

    restarted = start()
    assert post(restarted, alert_payload(fingerprint="a")).json()["results"][0]["result"] == "duplicate"
    assert len(engine.changes) == 1


def test_actions_are_answered_from_memory_not_by_reading_the_file(agent):
    _, start, audit_path = agent
    client = start(recent_records=3)
    post(client, alert_payload())
    audit_path.rename(audit_path.with_name("moved.jsonl"))
    body = client.get("/v1/actions?limit=0").json()
    assert [r["event"] for r in body["records"]] == ["decision", "applied", "episode_ended"]  # the last 3
    assert body["unreadable_lines"] == 0
