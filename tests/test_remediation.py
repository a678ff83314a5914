"""The remediation policy against a fake engine admin API and a fake Prometheus (real HTTP)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from inferd.agent.audit import AuditLog
from inferd.agent.engine_client import EngineClient, EngineError
from inferd.agent.prometheus import PrometheusClient
from inferd.agent.remediation import (
    Alert,
    Bounds,
    PolicyConfig,
    RemediationCollector,
    RemediationPolicy,
    judge,
)
from inferd.exporters.registry import CollectorSet

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
    # every target has a value unless a test says otherwise; no ALERTS series: alerts
    # count as resolved once a step is verified, unless a test sets "ALERTS"
    fake = FakePrometheus(
        {
            "inferd_kv_page_faults_total": [10.0],
            "time_to_first_token": [3.0],
            "DCGM_FI_PROF_SM_ACTIVE": [0.3],
            "inferd_kv_swap_bytes_total": [1e9],
            "fastpath_failures": [2.0],
            "up{": [0.0],
        }
    )
    yield fake
    fake.close()


@pytest.fixture
def clock():
    return ManualClock()


def make_policy(engine, prom, audit_path, clock, host=None, **settings):
    config = PolicyConfig(**{"cooldown_s": 300, "verify_window_s": 60, **settings})
    return RemediationPolicy(
        EngineClient(engine.url, TOKEN),
        AuditLog(audit_path, clock),
        config,
        PrometheusClient(prom.url),
        host=host,
        clock=clock,
    )


def firing(
    name="InferdKVCacheThrashing", fingerprint="a1", starts_at="2026-11-29T10:00:00Z", status="firing", **labels
):
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
    [
        ((5, 4, 1), "minimum <= maximum"),
        ((1, 4, 0), "max_step must be >= 1"),
        ((1.5, 4, 1), "minimum must be an integer"),
    ],
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
    [
        (10, 20, "lower", "worse"),
        (10, 10.5, "lower", "unchanged"),
        (10, 2, "lower", "improved"),
        (0.5, 0.2, "higher", "worse"),
        (0.5, 0.8, "higher", "improved"),
        (None, 3, "lower", "no_data"),
        (0, 0.5, "lower", "worse"),
    ],
)
def test_judge(baseline, after, better, outcome):
    assert judge(baseline, after, better, 0.1) == outcome
    assert judge(baseline, after, better, 0.1, noise=0.0) == outcome


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
    assert 'inferd_kv_page_faults_total{job="inferd-engine",instance="127.0.0.1:8000"}[30s]' in prom.queries[0]


def test_same_fingerprint_and_start_acts_once(engine, prom, audit_path, clock):
    policy = make_policy(engine, prom, audit_path, clock, cooldown_s=0)
    assert policy.handle(firing())["result"] == "applied"
    assert policy.handle(firing())["result"] == "duplicate"
    assert len(engine.changes) == 1


def test_unknown_alert_is_ignored_with_a_log_line(engine, prom, audit_path, clock, caplog):
    policy = make_policy(engine, prom, audit_path, clock)
    with caplog.at_level(logging.INFO, logger="inferd.agent.remediation"):
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
    assert engine.config["max_num_batched_tokens"] == 2560  # not KV-bound: bigger prefill chunks
    assert engine.config["max_num_seqs"] == 48
    assert policy.deferred == ["a2"]
    clock.advance(300)
    policy.tick()
    assert engine.config["max_num_seqs"] == 36
    assert policy.deferred == []
    assert [c["body"] for c in engine.changes] == [
        {"max_num_seqs": 48},
        {"max_num_batched_tokens": 2560},
        {"max_num_seqs": 36},
    ]
    # A deferred alert that resolves is dropped; once resolved for restore_after_s, the
    # values the thrash episodes changed go back (the second kept the first's original);
    # the TTFT rule's capacity step stays (its rule does not restore)
    assert policy.handle(firing(fingerprint="a3"))["result"] == "skipped_verifying"
    policy.handle(firing(fingerprint="a3", status="resolved"))
    clock.advance(100)
    policy.tick()
    clock.advance(1000)
    policy.tick()
    assert [c["body"] for c in engine.changes][3:] == [{"max_num_seqs": 64}]
    assert policy.in_force == {"max_num_batched_tokens": 2560}


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
    assert (verified["baseline"], verified["after"], verified["outcome"], verified["decision"]) == (
        10.0,
        25.0,
        "worse",
        "rolled_back",
    )
    rolled_back = next(r for r in records if r["event"] == "rolled_back")
    assert rolled_back["restored"] == {"max_num_seqs": 64}
    assert records[-1]["event"] == "episode_ended" and records[-1]["restore"] is None  # nothing left to restore


def test_verification_that_sees_improvement_keeps_the_change(engine, prom, audit_path, clock):
    prom.series["inferd_kv_page_faults_total"] = [10.0, 1.0]
    policy = make_policy(engine, prom, audit_path, clock)
    policy.handle(firing())
    clock.advance(60)
    policy.tick()
    assert engine.config["max_num_seqs"] == 48
    assert policy.rollbacks_total == {}
    assert events(audit_path)[-2:] == ["verified", "episode_ended"]
    verified = [json.loads(line) for line in audit_path.read_text().splitlines()][-2]
    assert (verified["outcome"], verified["decision"]) == ("improved", "kept")


@pytest.mark.parametrize(
    "generation, demand, outcome, decision",
    [
        ([100.0, 20.0], [40.0, 40.0], "worse_guard", "rolled_back"),  # faults gone, and most of the throughput
        ([100.0, 90.0], [40.0, 40.0], "improved", "kept"),  # throughput within the guard's tolerance
        ([100.0, 20.0], [40.0, 10.0], "demand_fell", "kept"),  # the load went away: serving less is no verdict
    ],
)
def test_a_step_that_fixes_its_target_by_serving_much_less_is_rolled_back(
    engine, prom, audit_path, clock, generation, demand, outcome, decision
):
    prom.series["inferd_kv_page_faults_total"] = [10.0, 1.0]
    prom.series["generation_tokens_total"] = list(generation)
    prom.series["num_requests_running"] = list(demand)
    policy = make_policy(engine, prom, audit_path, clock)
    policy.handle(firing())
    assert engine.config["max_num_seqs"] == 48
    clock.advance(60)
    policy.tick()
    verified = next(json.loads(line) for line in audit_path.read_text().splitlines() if '"verified"' in line)
    assert (verified["outcome"], verified["decision"]) == (outcome, decision)
    assert (verified["guard_before"], verified["guard_after"]) == tuple(generation)
    assert engine.config["max_num_seqs"] == (64 if decision == "rolled_back" else 48)


def test_cold_kv_once_max_num_seqs_is_at_its_minimum_then_at_limit(audit_path, prom, clock):
    engine = FakeEngine(TOKEN, audit_path, max_num_seqs=4)
    try:
        policy = make_policy(
            engine, prom, audit_path, clock, cooldown_s=0, verify_window_s=1, max_num_seqs=Bounds(4, 64, 8)
        )
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
    result = policy.handle(firing("InferdGPUUnderutilizedWithQueue", job="inferd-agent", instance="127.0.0.1:10400"))
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
    result = policy.handle(firing("InferdEngineDown", job="inferd-agent", instance="127.0.0.1:10400"))
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
    assert (
        'inferd_remediation_actions_total{action="lower_max_num_seqs",alert="InferdKVCacheThrashing",result="applied"} 1.0'
        in text
    )
    assert 'inferd_remediation_rollbacks_total{action="lower_max_num_seqs"} 1.0' in text
    stamp = next(
        line for line in text.splitlines() if line.startswith("inferd_remediation_last_action_timestamp_seconds{")
    )
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
    def __init__(self, pid=None, error=None, mem_node=None, cpus=None, restarts=2, starting=False, port_conflict=None):
        self.pid, self.error, self.restarts = pid, error, restarts
        self.port_conflict = port_conflict
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
    def crash_looping(self):
        return self.error is not None


def test_supervisor_host_reports_the_restart_state():
    from inferd.agent.engine_host import SupervisorHost

    assert "is restarting the engine (2 restart(s)" in SupervisorHost(StubSupervisor()).restart_engine()
    hung = StubSupervisor(pid=42)
    assert "restarted the unresponsive engine (pid 42)" in SupervisorHost(hung).restart_engine()
    assert len(hung.restart_reasons) == 1
    with pytest.raises(RuntimeError, match="still starting"):
        SupervisorHost(StubSupervisor(pid=42, starting=True)).restart_engine()
    with pytest.raises(RuntimeError, match="in a crash loop: bad model path"):
        SupervisorHost(StubSupervisor(error="bad model path")).restart_engine()
    with pytest.raises(RuntimeError, match="engine port 127.0.0.1:8000 is held by pid 7"):
        SupervisorHost(StubSupervisor(port_conflict="engine port 127.0.0.1:8000 is held by pid 7")).restart_engine()
    with pytest.raises(RuntimeError, match="no NUMA node"):
        SupervisorHost(StubSupervisor(pid=42)).rebind_engine()


def test_online_nodes_parses_ranges(tmp_path):
    from inferd.agent.engine_host import online_nodes

    (tmp_path / "devices/system/node").mkdir(parents=True)
    (tmp_path / "devices/system/node/online").write_text("0-1,3\n")
    assert online_nodes(tmp_path) == [0, 1, 3]


def test_rebind_this_process_to_its_own_node():
    import os
    from pathlib import Path

    from inferd.agent.engine_host import SupervisorHost, online_nodes

    if not Path("/sys/devices/system/node/online").exists():
        pytest.skip("no /sys/devices/system/node (NUMA sysfs) on this machine")
    node = online_nodes()[0]
    cpus = os.sched_getaffinity(0)
    host = SupervisorHost(StubSupervisor(pid=os.getpid(), mem_node=node, cpus=cpus))
    detail = host.rebind_engine()
    assert f"pages migrated to node {node}" in detail
    assert os.sched_getaffinity(0) == cpus


# ---- episodes: converging while the alert fires ----


def test_an_alert_that_keeps_firing_gets_the_next_step_each_window_then_escalates(audit_path, prom, clock):
    """Unchanged after each step and still firing (ALERTS says so): the next bounded step
    follows one verification window later, not a cooldown later; at the knob's bound the
    rule escalates to cold KV; with nothing left the episode ends at its limit."""
    engine = FakeEngine(TOKEN, audit_path, max_num_seqs=16)
    prom.series["ALERTS{"] = [1.0]
    try:
        policy = make_policy(
            engine,
            prom,
            audit_path,
            clock,
            cooldown_s=3600,
            verify_window_s=60,
            max_num_seqs=Bounds(4, 64, 8),
            step_fraction=0.5,
        )
        assert policy.handle(firing())["new"] == {"max_num_seqs": 8}
        for _ in range(3):
            clock.advance(60)
            policy.tick()
        assert [c["body"] for c in engine.changes] == [
            {"max_num_seqs": 8},
            {"max_num_seqs": 4},
            {"kv_cold_dtype": "int8"},
        ]
        assert policy.episodes == []  # cold KV on and max_num_seqs at 4: nothing left
        records = [json.loads(line) for line in audit_path.read_text().splitlines()]
        assert records[-2]["result"] == "at_limit" and records[-1]["event"] == "episode_ended"
        assert [r["decision"] for r in records if r["event"] == "verified"] == ["kept"] * 3
        assert policy.skipped_total == {("InferdKVCacheThrashing", "at_limit"): 1}
    finally:
        engine.close()


def test_a_step_that_made_it_worse_is_rolled_back_and_the_rule_escalates(audit_path, prom, clock):
    prom.series["inferd_kv_page_faults_total"] = [10.0, 30.0, 30.0, 5.0]
    prom.series["ALERTS{"] = [1.0, 0.0]  # firing after the first step, then gone
    engine = FakeEngine(TOKEN, audit_path)
    try:
        policy = make_policy(engine, prom, audit_path, clock, verify_window_s=60)
        policy.handle(firing())
        clock.advance(60)
        policy.tick()  # 10 -> 30 faults/s: rolled back, cold KV next
        assert [c["body"] for c in engine.changes] == [
            {"max_num_seqs": 48},
            {"max_num_seqs": 64},
            {"kv_cold_dtype": "int8"},
        ]
        prom.series["ALERTS{"] = []
        clock.advance(60)
        policy.tick()  # improved 30 -> 5 and the alert is gone: the episode ends, cold KV kept
        assert engine.config["kv_cold_dtype"] == "int8" and policy.episodes == []
        assert policy.in_force == {"kv_cold_dtype": "int8"}
        assert policy.rollbacks_total == {"lower_max_num_seqs": 1}
    finally:
        engine.close()


def test_no_baseline_means_no_action_and_no_value_after_means_rollback(engine, prom, audit_path, clock):
    del prom.series["time_to_first_token"]
    policy = make_policy(engine, prom, audit_path, clock)
    result = policy.handle(firing("InferdTTFTSLOBreach", fingerprint="t"))
    assert result["result"] == "no_data" and engine.changes == []
    assert policy.skipped_total == {("InferdTTFTSLOBreach", "no_data"): 1}
    assert "inferd_remediation" not in str(policy.actions_total)
    prom.series["time_to_first_token"] = [3.0]
    assert policy.handle(firing("InferdTTFTSLOBreach", fingerprint="t2"))["result"] == "applied"
    del prom.series["time_to_first_token"]  # the requests stopped: nothing to judge by
    clock.advance(60)
    policy.tick()
    assert engine.config["max_num_batched_tokens"] == 2048  # rolled back, not kept as no_data
    verified = next(json.loads(line) for line in audit_path.read_text().splitlines() if '"verified"' in line)
    assert (verified["outcome"], verified["decision"]) == ("no_data", "rolled_back")


def test_a_move_within_the_targets_own_spread_is_unchanged_not_worse(engine, prom, audit_path, clock):
    prom.series["inferd_kv_page_faults_total"] = [80.0, 100.0]
    prom.series["stddev"] = [12.0]  # the rate swings +-12/s on its own: 80 -> 100 is inside 2 sigma
    prom.series["ALERTS{"] = [1.0]
    policy = make_policy(engine, prom, audit_path, clock)
    policy.handle(firing())
    clock.advance(60)
    policy.tick()
    verified = next(json.loads(line) for line in audit_path.read_text().splitlines() if '"verified"' in line)
    assert (verified["outcome"], verified["decision"]) == ("unchanged", "kept")
    assert [c["body"] for c in engine.changes] == [{"max_num_seqs": 48}, {"max_num_seqs": 36}]  # the next step


def test_an_improvement_while_the_demand_went_away_is_not_credited(engine, prom, audit_path, clock):
    prom.series["inferd_kv_page_faults_total"] = [10.0, 1.0]
    prom.series["num_requests_running"] = [80.0, 20.0]
    policy = make_policy(engine, prom, audit_path, clock)
    policy.handle(firing())
    clock.advance(60)
    policy.tick()
    verified = next(json.loads(line) for line in audit_path.read_text().splitlines() if '"verified"' in line)
    assert (verified["outcome"], verified["demand_before"], verified["demand_after"]) == ("demand_fell", 80.0, 20.0)
    assert verified["decision"] == "kept"


def test_ttft_under_kv_queueing_turns_cold_kv_on_instead_of_moving_the_batch(engine, prom, audit_path, clock):
    prom.series["kv_cache_usage_perc"] = [0.97]
    prom.series["num_requests_waiting"] = [12.0]
    policy = make_policy(engine, prom, audit_path, clock)
    assert policy.handle(firing("InferdTTFTSLOBreach", fingerprint="t"))["new"] == {"kv_cold_dtype": "int8"}
    prom.series["kv_cache_usage_perc"] = [0.4]
    clock.advance(400)
    policy.tick()
    assert policy.handle(firing("InferdTTFTSLOBreach", fingerprint="t2"))["new"] == {"max_num_batched_tokens": 2560}


def test_ttft_with_long_prompts_sizes_the_chunk_to_hold_the_typical_prompt(engine, prom, audit_path, clock):
    engine.config["max_num_batched_tokens"] = 256
    prom.series["request_prompt_tokens"] = [2300.0]  # the mean prompt of the requests finished lately
    policy = make_policy(engine, prom, audit_path, clock)
    # one fraction of 256 would be 320; a chunk of 2,304 prefills a 2,300-token prompt in one step
    assert policy.handle(firing("InferdTTFTSLOBreach", fingerprint="t"))["new"] == {"max_num_batched_tokens": 2304}


def test_ttft_chunk_sizing_keeps_to_the_step_and_the_maximum():
    from inferd.agent.remediation_rules import DEFAULT_RULES, Facts, PolicyConfig

    (plan_ttft,) = DEFAULT_RULES["InferdTTFTSLOBreach"].planners
    pc = PolicyConfig.from_dict({"max_num_batched_tokens": {"minimum": 256, "maximum": 4096, "max_step": 1024}})
    config = {"max_num_seqs": 16, "max_num_batched_tokens": 256}
    assert plan_ttft(config, pc, Facts(prompt_tokens=3000.0)).new == {"max_num_batched_tokens": 1280}  # max_step
    assert plan_ttft({**config, "max_num_batched_tokens": 3584}, pc, Facts(prompt_tokens=9000.0)).new == {
        "max_num_batched_tokens": 4096
    }
    # prompts shorter than the chunk: the usual fraction, not a step down
    assert plan_ttft({**config, "max_num_batched_tokens": 1024}, pc, Facts(prompt_tokens=100.0)).new == {
        "max_num_batched_tokens": 1280
    }
    assert plan_ttft(config, pc, Facts()).new == {"max_num_batched_tokens": 320}  # no answer: one fraction


def test_the_ttft_target_is_a_mean_not_a_bucket_quantile():
    from inferd.agent.remediation_rules import DEFAULT_RULES

    target = DEFAULT_RULES["InferdTTFTSLOBreach"].target
    assert "histogram_quantile" not in target and "_sum" in target and "_count" in target


# ---- a fresh engine gets what is in force ----


def test_engine_restart_gets_the_policys_changes_back(engine, prom, audit_path, clock):
    policy = make_policy(engine, prom, audit_path, clock)
    policy.handle(firing())
    policy.handle(firing("InferdEngineFastPathFailing", fingerprint="fp"))
    assert policy.in_force == {"max_num_seqs": 48, "mode": "fallback"}
    engine.config.update(max_num_seqs=64, mode="fast")  # what a restarted engine starts with
    policy.on_engine_ready(2)
    assert (engine.config["max_num_seqs"], engine.config["mode"]) == (48, "fallback")
    record = [json.loads(line) for line in audit_path.read_text().splitlines()][-1]
    assert (record["event"], record["old"], record["new"]) == (
        "reapplied",
        {"max_num_seqs": 64, "mode": "fast"},
        {"max_num_seqs": 48, "mode": "fallback"},
    )
    assert events(audit_path)[-2:] == ["reapply", "reapplied"]  # the intent is on disk first
    policy.on_engine_ready(3)  # nothing missing: nothing sent
    assert len(engine.changes) == 4
    # the agent restarts too: what is in force comes back from the audit log
    assert make_policy(engine, prom, audit_path, clock).in_force == {"max_num_seqs": 48, "mode": "fallback"}


def test_an_engine_that_refuses_the_reapply_is_recorded_as_reverted(engine, prom, audit_path, clock):
    policy = make_policy(engine, prom, audit_path, clock)
    policy.handle(firing())
    engine.config["max_num_seqs"] = 64
    engine.fail_next = 422
    policy.on_engine_ready(2)
    record = [json.loads(line) for line in audit_path.read_text().splitlines()][-1]
    assert record["event"] == "reverted" and record["lost"] == {"max_num_seqs": 48}
    assert policy.in_force == {}
    assert make_policy(engine, prom, audit_path, clock).in_force == {}


def test_remediation_series_exist_before_the_first_decision(engine, prom, audit_path, clock):
    policy = make_policy(engine, prom, audit_path, clock)
    registry = CollectorRegistry()
    registry.register(CollectorSet([RemediationCollector(policy)]))
    text = generate_latest(registry).decode()
    assert (
        'inferd_remediation_actions_total{action="lower_max_num_seqs",alert="InferdKVCacheThrashing",result="applied"} 0.0'
        in text
    )
    assert "inferd_remediation_episodes 0.0" in text


def test_swap_bound_switches_to_recompute_and_keeps_it_after_the_alert_resolves(engine, prom, audit_path, clock):
    # 30% of the engine's time in swap copies before, none after (recompute copies nothing)
    prom.series["inferd_kv_swap_seconds_total"] = [0.3, 0.0]
    policy = make_policy(engine, prom, audit_path, clock, restore_after_s=120, cooldown_s=0)
    bound = dict(name="InferdKVSwapBound", fingerprint="sb")
    assert policy.handle(firing(**bound))["result"] == "applied"
    assert engine.config["preemption_mode"] == "recompute"
    clock.advance(60)
    policy.tick()
    assert events(audit_path)[-1] != "rollback"  # swap time fell: kept
    policy.handle(firing(**bound, status="resolved"))
    clock.advance(600)
    policy.tick()
    # A slow link does not heal by itself: no restore to swap, unlike a thrashing episode's values.
    assert engine.config["preemption_mode"] == "recompute"
    assert "restored" not in events(audit_path)


def test_an_underused_gpu_with_a_queue_gets_seats_for_what_waits(engine, prom, audit_path, clock):
    engine.config["max_num_seqs"] = 4
    prom.series["num_requests_waiting"] = [30.0]
    policy = make_policy(engine, prom, audit_path, clock, max_num_seqs={"minimum": 4, "maximum": 128, "max_step": 32})
    # the alert is on the agent's GPU series: the queue is read through the engine's selector
    alert = firing("InferdGPUUnderutilizedWithQueue", instance="127.0.0.1:10400", job="")
    assert policy.handle(alert)["new"] == {"max_num_seqs": 34, "max_num_batched_tokens": 2560}  # 4 + 30
    queries = " ".join(prom.queries)
    assert 'vllm:num_requests_waiting{job="inferd-engine"}' in queries


def test_steps_stay_within_the_engines_bounds(audit_path, prom, clock, caplog):
    """The agent's own bounds (max_num_seqs up to 512) reach past what this engine accepts
    (70): the policy clamps them to the engine's and plans a value the engine takes."""
    engine = FakeEngine(TOKEN, audit_path, bounds={"max_num_seqs": (1, 70)})
    try:
        policy = make_policy(engine, prom, audit_path, clock)
        alert = firing("InferdGPUUnderutilizedWithQueue", job="inferd-agent", instance="127.0.0.1:10400")
        with caplog.at_level(logging.WARNING, logger="inferd.agent.remediation"):
            result = policy.handle(alert)
        assert result["result"] == "applied", result
        assert result["new"]["max_num_seqs"] == 70  # 64 + 16 would be refused
        assert engine.config["max_num_seqs"] == 70
        assert "max_num_seqs [4, 512] reach past the engine's [1, 70]: clamped to [4, 70]" in caplog.text
    finally:
        engine.close()


def test_every_planned_value_is_one_the_engine_accepts():
    """Each rule's planners, from configs across the engine's range and with the agent's
    bounds wider than the engine's, plan only values the engine's bounds admit."""
    from inferd.agent.remediation.engine_bounds import EngineBounds
    from inferd.agent.remediation_rules import DEFAULT_RULES, Facts

    engine = {"max_num_seqs": (8, 40), "max_num_batched_tokens": (512, 4096)}
    wide = PolicyConfig(max_num_seqs=Bounds(1, 1024, 64), max_num_batched_tokens=Bounds(16, 1 << 20, 8192))
    policy = EngineBounds(wide).policy_for(engine)
    facts = (Facts(), Facts(kv_usage=0.95, waiting=500, prompt_tokens=100_000))
    planned = 0
    for seqs in (8, 9, 24, 39, 40):
        for tokens in (512, 600, 4000, 4096):
            config = {"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "kv_cold_dtype": "none"}
            for rule in DEFAULT_RULES.values():
                for planner in rule.planners:
                    for fact in facts:
                        plan = planner({**config, "preemption_mode": "swap"}, policy, fact)
                        if isinstance(plan, str):
                            continue
                        for name, value in plan.new.items():
                            if name in engine:
                                low, high = engine[name]
                                assert low <= value <= high, (rule.alert, plan)
                                planned += 1
    assert planned > 0


def test_configured_bounds_are_clamped_to_the_engines_only_where_wider(caplog):
    from inferd.agent.remediation.engine_bounds import EngineBounds, clamp

    assert clamp(Bounds(4, 512, 16), 1, 1024) == Bounds(4, 512, 16)  # narrower: operator policy, kept
    assert clamp(Bounds(4, 2048, 16), 1, 1024) == Bounds(4, 1024, 16)
    assert clamp(Bounds(2000, 4000, 16), 1, 1024) == Bounds(1024, 1024, 16)  # wholly outside: the nearer end
    config = PolicyConfig()
    bounds = EngineBounds(config)
    with caplog.at_level(logging.WARNING, logger="inferd.agent.remediation"):
        assert bounds.policy_for({}) is config  # an engine that publishes no bounds
        assert bounds.policy_for({"max_num_seqs": (1, 1024), "max_num_batched_tokens": (16, 1 << 20)}) is config
    assert caplog.text == ""


def test_the_engine_client_keeps_the_engines_bounds(engine):
    client = EngineClient(engine.url, TOKEN)
    assert client.bounds == {}
    client.get_config()
    assert client.bounds == {"max_num_seqs": (1, 1024), "max_num_batched_tokens": (16, 1 << 20)}
    assert client.choices["mode"] == ("fast", "fallback")
    client.close()


def test_ttft_with_every_seat_taken_and_a_queue_adds_seats_for_the_queue(engine, prom, audit_path, clock):
    engine.config["max_num_seqs"] = 4
    prom.series["num_requests_running"] = [4.0]
    prom.series["num_requests_waiting"] = [30.0]
    prom.series["kv_cache_usage_perc"] = [0.2]
    policy = make_policy(engine, prom, audit_path, clock)
    # 4 + 30 waiting, within the default max_step of 16: the chunk is not what holds them back
    assert policy.handle(firing("InferdTTFTSLOBreach", fingerprint="t"))["new"] == {"max_num_seqs": 20}


def test_ttft_on_a_swap_bound_engine_preempts_by_recompute_first():
    from inferd.agent.remediation_rules import DEFAULT_RULES, Facts, PolicyConfig

    (plan_ttft,) = DEFAULT_RULES["InferdTTFTSLOBreach"].planners
    pc = PolicyConfig()
    config = {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "kv_cold_dtype": "none", "preemption_mode": "swap"}
    full_and_swapping = Facts(running=8, waiting=3, kv_usage=0.95, swap_time_share=0.3)
    assert plan_ttft(config, pc, full_and_swapping).new == {"preemption_mode": "recompute"}  # not cold KV
    # a healthy link swapping a little: the KV-bound step as before
    assert plan_ttft(config, pc, Facts(running=8, waiting=3, kv_usage=0.95, swap_time_share=0.05)).new == {
        "kv_cold_dtype": "int8"
    }
    recomputing = {**config, "preemption_mode": "recompute"}
    assert plan_ttft(recomputing, pc, full_and_swapping).new == {"kv_cold_dtype": "int8"}


def test_the_swap_bound_share_is_the_alerts_threshold():
    from inferd.agent.remediation_rules import SWAP_BOUND_SHARE

    params = yaml.safe_load((Path(__file__).parents[1] / "alerts" / "params.yml").read_text())
    assert params["thresholds"]["kv_swap_time_share"] == SWAP_BOUND_SHARE


def test_ttft_seats_branch_needs_every_seat_taken_and_room_in_the_kv_cache():
    from inferd.agent.remediation_rules import DEFAULT_RULES, Facts, PolicyConfig

    (plan_ttft,) = DEFAULT_RULES["InferdTTFTSLOBreach"].planners
    pc = PolicyConfig()
    config = {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "kv_cold_dtype": "none"}
    assert plan_ttft(config, pc, Facts(running=8, waiting=3)).new == {"max_num_seqs": 11}
    assert plan_ttft(config, pc, Facts(running=5, waiting=3)).new == {"max_num_batched_tokens": 2560}  # seats free
    assert plan_ttft(config, pc, Facts(running=8, waiting=3, kv_usage=0.95)).new == {"kv_cold_dtype": "int8"}
    # a thrashing pool between two preemptions: not more seats
    assert plan_ttft(config, pc, Facts(running=8, waiting=3, kv_usage=0.6, preemptions_per_s=2.0)).new == {
        "max_num_batched_tokens": 2560
    }
    at_max = {**config, "max_num_seqs": 512}
    assert plan_ttft(at_max, pc, Facts(running=512, waiting=3)).new == {"max_num_batched_tokens": 2560}
