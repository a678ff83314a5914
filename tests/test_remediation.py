"""The remediation policy against a fake engine admin API and a fake Prometheus (real HTTP)."""
from __future__ import annotations

import json
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.audit import AuditLog
from agent.engine_client import EngineClient, EngineError
from agent.remediation import (
    Alert,
    Bounds,
    PolicyConfig,
    PrometheusQuery,
    RemediationCollector,
    RemediationPolicy,
    judge,
)
from exporters.registry import CollectorSet
from remediation_fakes import FakeEngine, FakePrometheus, ManualClock

TOKEN = "admin-secret"


@pytest.fixture
def audit_path(tmp_path):
    return tmp_path / "state" / "audit.jsonl"


@pytest.fixture
def engine(audit_path):
    fake = FakeEngine(TOKEN, audit_path)
    yield fake
    fake.close()


@pytest.fixture
def prom():
    fake = FakePrometheus()
    yield fake
    fake.close()


@pytest.fixture
def clock():
    return ManualClock()


def make_policy(engine, prom, audit_path, clock, host=None, **settings):
    config = PolicyConfig(**{"cooldown_s": 300, "verify_window_s": 60, **settings})
    return RemediationPolicy(EngineClient(engine.url, TOKEN), AuditLog(audit_path, clock), config,
                             PrometheusQuery(prom.url), host=host, clock=clock)


def firing(name="InferdKVCacheThrashing", fingerprint="a1", starts_at="2026-11-29T10:00:00Z", status="firing", **labels):
    base = {"alertname": name, "job": "inferd-engine", "instance": "127.0.0.1:8000", "remediate": "true"}
    return Alert(status, {**base, **labels}, {"description": "x"}, starts_at, fingerprint)


def events(audit_path):
    return [json.loads(line)["event"] for line in audit_path.read_text().splitlines()]


# ---- bounds and configuration ----

@pytest.mark.parametrize(
    "value, lowered, raised",
    [(64, 48, 80), (8, 6, 10), (2, 1, 3), (1, 1, 2), (2000, 1008, 1024), (1024, 1008, 1024)],
)
def test_bounds_steps_are_proportional_capped_and_clamped(value, lowered, raised):
    bounds = Bounds(1, 1024, 16)
    assert bounds.lower(value, 0.25) == lowered
    assert bounds.higher(value, 0.25) == raised


@pytest.mark.parametrize(
    "args, message",
    [((5, 4, 1), "minimum <= maximum"), ((1, 4, 0), "max_step must be >= 1"), ((1.5, 4, 1), "minimum must be an integer")],
)
def test_bad_bounds_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        Bounds(*args)


def test_policy_config_from_dict():
    config = PolicyConfig.from_dict({"max_num_seqs": {"minimum": 2, "maximum": 32, "max_step": 4}, "cooldown_s": 5})
    assert config.max_num_seqs == Bounds(2, 32, 4)
    with pytest.raises(ValueError, match="unknown remediation setting.*colldown_s"):
        PolicyConfig.from_dict({"colldown_s": 5})
    with pytest.raises(ValueError, match="step_fraction"):
        PolicyConfig(step_fraction=0)


@pytest.mark.parametrize(
    "baseline, after, better, outcome",
    [(10, 20, "lower", "worse"), (10, 10.5, "lower", "unchanged"), (10, 2, "lower", "improved"),
     (0.5, 0.2, "higher", "worse"), (0.5, 0.8, "higher", "improved"), (None, 3, "lower", "no_data"),
     (0, 0.5, "lower", "worse")],
)
def test_judge(baseline, after, better, outcome):
    assert judge(baseline, after, better, 0.1) == outcome


# ---- acting ----

def test_thrashing_lowers_max_num_seqs_after_the_intent_is_on_disk(engine, prom, audit_path, clock):
    prom.series["inferd_kv_page_faults_total"] = [12.0]
    policy = make_policy(engine, prom, audit_path, clock)
    result = policy.handle(firing())
    assert result["result"] == "applied"
    assert (result["old"], result["new"]) == ({"max_num_seqs": 64}, {"max_num_seqs": 48})
    assert engine.config["max_num_seqs"] == 48
    [change] = engine.changes
    on_disk = [json.loads(line) for line in change["audit_at_request"].splitlines()]
    assert on_disk[-1]["event"] == "decision" and on_disk[-1]["new"] == {"max_num_seqs": 48}
    assert events(audit_path) == ["alert", "decision", "applied"]
    assert policy.actions_total == {("InferdKVCacheThrashing", "lower_max_num_seqs", "applied"): 1}
    assert policy.last_action_ts == {"lower_max_num_seqs": clock.now}
    assert 'inferd_kv_page_faults_total{job="inferd-engine",instance="127.0.0.1:8000"}[60s]' in prom.queries[0]


def test_same_fingerprint_and_start_acts_once(engine, prom, audit_path, clock):
    policy = make_policy(engine, prom, audit_path, clock, cooldown_s=0)
    assert policy.handle(firing())["result"] == "applied"
    assert policy.handle(firing())["result"] == "duplicate"
    assert len(engine.changes) == 1


def test_unknown_alert_is_ignored_with_a_log_line(engine, prom, audit_path, clock, caplog):
    policy = make_policy(engine, prom, audit_path, clock)
    with caplog.at_level(logging.INFO, logger="agent.remediation"):
        result = policy.handle(firing("InferdCollectorDown"))
    assert result["result"] == "ignored"
    assert "no remediation rule for alert 'InferdCollectorDown'" in caplog.text
    assert engine.changes == []


def test_no_repeat_while_verifying_and_skipped_alerts_wait_for_their_turn(engine, prom, audit_path, clock):
    prom.series["inferd_kv_page_faults_total"] = [12.0, 3.0]
    policy = make_policy(engine, prom, audit_path, clock, cooldown_s=300, verify_window_s=60)
    policy.handle(firing(fingerprint="a1"))
    clock.advance(30)
    assert policy.handle(firing(fingerprint="a2"))["result"] == "skipped_verifying"
    # Another config change is also held back while this one is verified.
    assert policy.handle(firing("InferdTTFTSLOBreach", fingerprint="t1"))["result"] == "skipped_verifying"
    assert policy.deferred == ["a2", "t1"]
    clock.advance(31)
    policy.tick()  # a1 verified; t1 may go now, a2 waits for the thrashing rule's cooldown
    assert engine.config["max_num_batched_tokens"] == 1536
    assert engine.config["max_num_seqs"] == 48
    assert policy.deferred == ["a2"]
    clock.advance(300)
    policy.tick()
    assert engine.config["max_num_seqs"] == 36
    assert policy.deferred == []
    assert [c["body"] for c in engine.changes] == [
        {"max_num_seqs": 48}, {"max_num_batched_tokens": 1536}, {"max_num_seqs": 36}]
    # A deferred alert that resolves is dropped.
    assert policy.handle(firing(fingerprint="a3"))["result"] == "skipped_verifying"
    policy.handle(firing(fingerprint="a3", status="resolved"))
    clock.advance(1000)
    policy.tick()
    assert len(engine.changes) == 3


def test_verification_that_sees_the_metric_worsen_rolls_back(engine, prom, audit_path, clock):
    prom.series["inferd_kv_page_faults_total"] = [10.0, 25.0]
    policy = make_policy(engine, prom, audit_path, clock)
    policy.handle(firing())
    assert engine.config["max_num_seqs"] == 48
    clock.advance(59)
    policy.tick()
    assert engine.config["max_num_seqs"] == 48  # window not over yet
    clock.advance(1)
    policy.tick()
    assert engine.config["max_num_seqs"] == 64
    assert policy.rollbacks_total == {"lower_max_num_seqs": 1}
    records = [json.loads(line) for line in audit_path.read_text().splitlines()]
    verified = next(r for r in records if r["event"] == "verified")
    assert (verified["baseline"], verified["after"], verified["outcome"]) == (10.0, 25.0, "worse")
    assert records[-1]["event"] == "rolled_back" and records[-1]["restored"] == {"max_num_seqs": 64}


def test_verification_that_sees_improvement_keeps_the_change(engine, prom, audit_path, clock):
    prom.series["inferd_kv_page_faults_total"] = [10.0, 1.0]
    policy = make_policy(engine, prom, audit_path, clock)
    policy.handle(firing())
    clock.advance(60)
    policy.tick()
    assert engine.config["max_num_seqs"] == 48
    assert policy.rollbacks_total == {}
    assert events(audit_path)[-1] == "verified"


def test_cold_kv_once_max_num_seqs_is_at_its_minimum_then_at_limit(audit_path, prom, clock):
    engine = FakeEngine(TOKEN, audit_path, max_num_seqs=4)
    try:
        policy = make_policy(engine, prom, audit_path, clock, cooldown_s=0, verify_window_s=1,
                             max_num_seqs=Bounds(4, 64, 8))
        assert policy.handle(firing(fingerprint="a"))["action"] == "enable_cold_kv_int8"
        assert engine.config["kv_cold_dtype"] == "int8"
        clock.advance(2)
        policy.tick()
        result = policy.handle(firing(fingerprint="b"))
        assert result["result"] == "at_limit"
        assert "minimum 4" in result["detail"]
        assert len(engine.changes) == 1
    finally:
        engine.close()


def test_dry_run_records_but_does_not_touch_the_engine(engine, prom, audit_path, clock):
    policy = make_policy(engine, prom, audit_path, clock, dry_run=True)
    result = policy.handle(firing())
    assert result["result"] == "dry_run"
    assert result["new"] == {"max_num_seqs": 48}
    assert engine.changes == []
    assert engine.config["max_num_seqs"] == 64
    assert policy.handle(firing(fingerprint="b"))["result"] == "skipped_cooldown"


def test_engine_refusal_is_recorded_as_failed(engine, prom, audit_path, clock):
    engine.fail_next = 422
    policy = make_policy(engine, prom, audit_path, clock)
    result = policy.handle(firing())
    assert result["result"] == "failed"
    assert "422" in result["error"]
    assert events(audit_path) == ["alert", "decision", "failed"]
    assert policy.actions_total == {("InferdKVCacheThrashing", "lower_max_num_seqs", "failed"): 1}


def test_raise_batch_and_recompute(engine, prom, audit_path, clock):
    policy = make_policy(engine, prom, audit_path, clock, cooldown_s=0, verify_window_s=1)
    result = policy.handle(firing("InferdGPUUnderutilizedWithQueue", job="inferd-agent", instance="127.0.0.1:9400"))
    assert result["new"] == {"max_num_seqs": 80, "max_num_batched_tokens": 2560}
    clock.advance(2)
    policy.tick()
    assert policy.handle(firing("InferdPCIeLinkDegraded", fingerprint="p1"))["new"] == {"preemption_mode": "recompute"}
    clock.advance(2)
    policy.tick()
    assert policy.handle(firing("InferdPCIeBandwidthSaturated", fingerprint="p2"))["result"] == "at_limit"


class FakeHost:
    def __init__(self):
        self.restarts = 0

    def restart_engine(self) -> str:
        self.restarts += 1
        return "restart requested"

    def rebind_engine(self) -> str:
        return "pages migrated"


def test_engine_down_asks_the_supervisor(engine, prom, audit_path, clock):
    host = FakeHost()
    policy = make_policy(engine, prom, audit_path, clock, host=host)
    result = policy.handle(firing("InferdEngineDown", job="inferd-agent", instance="127.0.0.1:9400"))
    assert result["result"] == "applied" and host.restarts == 1
    assert engine.changes == []


def test_without_a_supervisor_restart_is_unsupported(engine, prom, audit_path, clock):
    policy = make_policy(engine, prom, audit_path, clock)
    assert policy.handle(firing("InferdEngineDown"))["result"] == "unsupported"


def test_fallback_then_restore_after_resolved_for_a_while(engine, prom, audit_path, clock):
    policy = make_policy(engine, prom, audit_path, clock, restore_after_s=120, cooldown_s=0)
    fast_path = dict(name="InferdEngineFastPathFailing", fingerprint="fp")
    assert policy.handle(firing(**fast_path))["result"] == "applied"
    assert engine.config["mode"] == "fallback"
    assert policy.handle(firing(**fast_path, status="resolved"))["result"] == "restore_scheduled"
    clock.advance(100)
    policy.tick()
    assert engine.config["mode"] == "fallback"
    # It fires again before the restore: the restore is cancelled.
    policy.handle(firing(**{**fast_path, "fingerprint": "fp2"}))
    clock.advance(30)
    policy.tick()
    assert engine.config["mode"] == "fallback"
    policy.handle(firing(**{**fast_path, "fingerprint": "fp2"}, status="resolved"))
    clock.advance(121)
    policy.tick()
    assert engine.config["mode"] == "fast"
    assert events(audit_path)[-2:] == ["restore", "restored"]
    assert policy.actions_total[("InferdEngineFastPathFailing", "restore_fast", "applied")] == 1


def test_state_survives_a_restart(engine, prom, audit_path, clock):
    prom.series["inferd_kv_page_faults_total"] = [10.0, 30.0]
    first = make_policy(engine, prom, audit_path, clock)
    first.handle(firing(fingerprint="a1"))
    clock.advance(10)
    # The agent restarts while the change is being verified.
    second = make_policy(engine, prom, audit_path, clock)
    assert second.verifying == first.verifying
    assert second.handle(firing(fingerprint="a1"))["result"] == "duplicate"
    assert second.handle(firing(fingerprint="a2"))["result"] == "skipped_verifying"
    clock.advance(60)
    second.tick()
    assert engine.config["max_num_seqs"] == 64  # the resumed verification rolled it back
    assert second.handle(firing(fingerprint="a3"))["result"] == "skipped_cooldown"
    second.handle(firing(fingerprint="a3", status="resolved"))
    third = make_policy(engine, prom, audit_path, clock)
    assert third.rollbacks_total == {"lower_max_num_seqs": 1}
    assert third.actions_total[("InferdKVCacheThrashing", "lower_max_num_seqs", "applied")] == 1
    assert third.deferred == ["a2"]  # still firing, skipped while a1 was verified
    assert third.handle(firing(fingerprint="a4"))["result"] == "skipped_cooldown"
    clock.advance(300)
    third.tick()  # the cooldown is over: a2 gets its one action, a4 waits for its verification
    assert [c["body"] for c in engine.changes][-1] == {"max_num_seqs": 48}
    assert len(engine.changes) == 3
    assert third.deferred == ["a4"]


def test_pending_restore_survives_a_restart(engine, prom, audit_path, clock):
    policy = make_policy(engine, prom, audit_path, clock, restore_after_s=120)
    policy.handle(firing("InferdEngineFastPathFailing", fingerprint="fp"))
    policy.handle(firing("InferdEngineFastPathFailing", fingerprint="fp", status="resolved"))
    restarted = make_policy(engine, prom, audit_path, clock, restore_after_s=120)
    assert restarted.restore_due == clock.now + 120
    clock.advance(120)
    restarted.tick()
    assert engine.config["mode"] == "fast"


def test_metrics(engine, prom, audit_path, clock):
    prom.series["inferd_kv_page_faults_total"] = [10.0, 30.0]
    policy = make_policy(engine, prom, audit_path, clock)
    policy.handle(firing())
    policy.handle(firing("InferdCollectorDown", fingerprint="c"))
    clock.advance(60)
    policy.tick()
    registry = CollectorRegistry()
    registry.register(CollectorSet([RemediationCollector(policy)]))
    text = generate_latest(registry).decode()
    assert 'inferd_remediation_actions_total{action="lower_max_num_seqs",alert="InferdKVCacheThrashing",result="applied"} 1.0' in text
    assert 'inferd_remediation_rollbacks_total{action="lower_max_num_seqs"} 1.0' in text
    stamp = next(line for line in text.splitlines() if line.startswith("inferd_remediation_last_action_timestamp_seconds{"))
    assert float(stamp.split()[-1]) == clock.now
    assert 'inferd_collector_up{collector="remediation"} 1.0' in text


def test_torn_last_line_is_skipped(audit_path, clock, caplog):
    log = AuditLog(audit_path, clock)
    log.append("alert", alert="X", status="firing", fingerprint="f", starts_at="s")
    with open(audit_path, "a") as fh:
        fh.write('{"ts": 1, "event": "deci')
    with caplog.at_level(logging.WARNING):
        records = log.read()
    assert [r["event"] for r in records] == ["alert"]
    assert "line 2 is not JSON" in caplog.text


def test_engine_client_errors_name_the_problem(engine):
    client = EngineClient(engine.url, "wrong")
    with pytest.raises(EngineError, match="HTTP 401") as info:
        client.get_config()
    assert info.value.status == 401
    with pytest.raises(EngineError, match="ConnectError"):
        EngineClient("http://127.0.0.1:9", TOKEN, timeout_s=1).get_config()
    with pytest.raises(ValueError, match="must start with http"):
        EngineClient("127.0.0.1:8000", TOKEN)


# ---- the supervisor adapter ----

class StubSupervisor:
    def __init__(self, pid=None, error=None, mem_node=None, cpus=None, restarts=2, starting=False):
        self.pid, self.error, self.restarts = pid, error, restarts
        self.config = type("C", (), {"mem_node": mem_node, "cpus": cpus})()
        self.starting = starting
        self.restart_reasons = []

    def restart(self, reason):
        if self.starting:
            return False
        self.restart_reasons.append(reason)
        return True

    @property
    def is_up(self):
        return self.pid is not None

    @property
    def has_given_up(self):
        return self.error is not None


def test_supervisor_host_reports_the_restart_state():
    from agent.engine_host import SupervisorHost

    assert "is restarting the engine (2 restart(s)" in SupervisorHost(StubSupervisor()).restart_engine()
    hung = StubSupervisor(pid=42)
    assert "restarted the unresponsive engine (pid 42)" in SupervisorHost(hung).restart_engine()
    assert len(hung.restart_reasons) == 1
    with pytest.raises(RuntimeError, match="still starting"):
        SupervisorHost(StubSupervisor(pid=42, starting=True)).restart_engine()
    with pytest.raises(RuntimeError, match="gave up on the engine: bad model path"):
        SupervisorHost(StubSupervisor(error="bad model path")).restart_engine()
    with pytest.raises(RuntimeError, match="no NUMA node"):
        SupervisorHost(StubSupervisor(pid=42)).rebind_engine()


def test_online_nodes_parses_ranges(tmp_path):
    from agent.engine_host import online_nodes

    (tmp_path / "devices/system/node").mkdir(parents=True)
    (tmp_path / "devices/system/node/online").write_text("0-1,3\n")
    assert online_nodes(tmp_path) == [0, 1, 3]


def test_rebind_this_process_to_its_own_node():
    import os
    from pathlib import Path

    from agent.engine_host import SupervisorHost, online_nodes

    if not Path("/sys/devices/system/node/online").exists():
        pytest.skip("no /sys/devices/system/node (NUMA sysfs) on this machine")
    node = online_nodes()[0]
    cpus = os.sched_getaffinity(0)
    host = SupervisorHost(StubSupervisor(pid=os.getpid(), mem_node=node, cpus=cpus))
    detail = host.rebind_engine()
    assert f"pages migrated to node {node}" in detail
    assert os.sched_getaffinity(0) == cpus
