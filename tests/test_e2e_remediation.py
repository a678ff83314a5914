"""End to end, real processes on loopback: the distribution's Prometheus and Alertmanager
with the repository's own rules and Alertmanager config (durations scaled through
`alerts/render.py --time-scale`, see alerts/README.md), a real agent supervising a real
engine serving the tiny model.

1. thrashing load -> InferdKVCacheThrashing -> max_num_seqs lowered -> faults fall ->
   alert resolves; the audit log holds the story;
2. engine killed -> InferdEngineDown -> engine back -> alert resolves;
3. injected fast-path failure -> InferdEngineFastPathFailing -> fallback -> restored to
   fast; no request in flight fails.

The stack is agent/scenario/stack.py's (the scenario benchmark runs the same one).
Timings are recorded in BENCHMARKS.md by scripts/bench_remediation.py, not asserted here.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from inferd.agent.remediation_rules import Bounds
from inferd.agent.scenario.stack import MissingBinary, Stack, binary, make_tiny_model, wait_for

from server_fixtures import child_pids, metric_value

pytestmark = pytest.mark.slow

TIME_SCALE = 1 / 30  # 2m -> 4s, 5m -> 10s, 1m -> 2s
ADMIN_TOKEN = "e2e-admin-token"
# The engine: a KV pool of 24 blocks of 16 tokens; 16 sequences of 64 tokens need 64.
ENGINE_ARGS = [
    "--kv-cache-bytes=196608",
    "--max-num-seqs=16",
    "--served-model-name=tiny",
    "--enable-fault-injection",
    "--log-level=WARNING",
]
# 0.75: 16 -> 4 in one step (4 x 4 blocks fit the pool); scripts/bench_remediation.py
# --step-fraction 0.25 takes several steps (16 -> 12 -> 9 -> 7 -> 5), one per verification window.
STEP_FRACTION = float(os.environ.get("INFERD_E2E_STEP_FRACTION", "0.75"))
POLICY = {
    "max_num_seqs": {"minimum": 1, "maximum": 64, "max_step": 12},
    "step_fraction": STEP_FRACTION,
    "cooldown_s": 20,
    "verify_window_s": float(os.environ.get("INFERD_E2E_VERIFY_WINDOW_S", "6")),
    "restore_after_s": 3,
    # No throughput guard here: on the tiny CPU model thrashing costs next to nothing, so any
    # step that lowers concurrency costs output tokens/s and the guard rolls it back. This
    # test follows the fault-driven path; the guard has its own tests (test_remediation.py).
    "guard_query": "",
}


class Load:
    """Closed-loop completions from `workers` threads; every status code is kept."""

    def __init__(self, url: str, workers: int, max_tokens: int = 40):
        self.url, self.max_tokens = url, max_tokens
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(workers)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)

    def _work(self, seed: int) -> None:
        import random

        rng = random.Random(seed)
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                prompt = [rng.randrange(5, 500) for _ in range(24)]
                try:
                    r = client.post(
                        f"{self.url}/v1/completions",
                        json={
                            "model": "tiny",
                            "prompt": prompt,
                            "max_tokens": self.max_tokens,
                            "ignore_eos": True,
                            "temperature": 0,
                        },
                    )
                    self.statuses.append(r.status_code)
                    if r.status_code != 200:
                        self.errors.append(r.text[:300])
                except httpx.HTTPError as exc:
                    self.statuses.append(0)
                    self.errors.append(repr(exc))
                    time.sleep(0.2)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    try:
        binary("prometheus")
        binary("prometheus-alertmanager", "alertmanager")
    except MissingBinary as exc:
        pytest.skip(str(exc))
    tmp = tmp_path_factory.mktemp("e2e-remediation")
    model = make_tiny_model(tmp / "tiny")
    s = Stack(tmp, time_scale=TIME_SCALE, engine_args=ENGINE_ARGS, policy=POLICY, admin_token=ADMIN_TOKEN)
    try:
        s.start(model)
        yield s
    finally:
        s.stop()


FAULTS_RATE = "sum(rate(inferd_kv_page_faults_total[4s]))"


def _save_timings(name: str, values: dict) -> None:
    """With INFERD_E2E_TIMINGS=PATH, each scenario adds its timeline there (benchmark input)."""
    path = os.environ.get("INFERD_E2E_TIMINGS")
    if not path:
        return
    data = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    data[name] = values
    Path(path).write_text(json.dumps(data, indent=2))


def test_kv_thrashing_is_remediated(stack):
    load_started = time.time()
    with Load(stack.url("engine"), workers=16) as load:
        applied = wait_for(
            lambda: stack.find(load_started, event="applied", alert="InferdKVCacheThrashing"),
            120,
            "the agent to lower max_num_seqs",
            stack,
        )
        assert applied["action"] == "lower_max_num_seqs"
        first_step = Bounds(**POLICY["max_num_seqs"]).lower(16, STEP_FRACTION)
        assert applied["old"] == {"max_num_seqs": 16} and applied["new"] == {"max_num_seqs": first_step}
        faults_before = stack.query(f"max_over_time(({FAULTS_RATE})[10s:1s])")
        # The fault rate falls while the same load keeps coming (after as many steps as it takes).
        wait_for(
            lambda: (stack.query(FAULTS_RATE) or 0) < 1 and stack.query("sum(rate(vllm:generation_tokens_total[4s]))"),
            300,
            "the page-fault rate to fall under load",
            stack,
        )
        verified = wait_for(lambda: stack.find(event="verified", id=applied["id"]), 60, "verification", stack)
        if first_step <= 6:  # one step is enough: it must be seen to help
            assert verified["outcome"] == "improved", verified
            assert verified["after"] < verified["baseline"]
        wait_for(
            lambda: stack.find(load_started, event="alert", alert="InferdKVCacheThrashing", status="resolved"),
            120,
            "InferdKVCacheThrashing to resolve",
            stack,
        )
        steps = [
            r
            for r in stack.records()
            if r["event"] == "applied" and r.get("alert") == "InferdKVCacheThrashing" and r["ts"] >= load_started
        ]
        values = [r["new"]["max_num_seqs"] for r in steps]
        assert values == sorted(values, reverse=True) and len(set(values)) == len(values), values
        assert not stack.firing("InferdKVCacheThrashing")
        faults_after = stack.query(FAULTS_RATE)
    assert load.statuses and set(load.statuses) == {200}, load.errors[:3]
    firing = stack.find(load_started, event="alert", alert="InferdKVCacheThrashing", status="firing")
    resolved = stack.find(load_started, event="alert", alert="InferdKVCacheThrashing", status="resolved")
    _save_timings(
        "kv_thrashing",
        {
            "time_scale": TIME_SCALE,
            "load_started": load_started,
            "alert_received": firing["ts"],
            "action_applied": applied["ts"],
            "verified": verified["ts"],
            "resolved_received": resolved["ts"],
            "faults_per_s_peak_before": faults_before,
            "faults_per_s_after": faults_after,
            "requests": len(load.statuses),
            "steps": values,
            "step_fraction": STEP_FRACTION,
        },
    )
    story = [
        (r["event"], r.get("status") or r.get("result") or r.get("outcome"))
        for r in stack.records()
        if r.get("alert") == "InferdKVCacheThrashing" and r["ts"] >= load_started
    ]
    assert story[0] == ("alert", "firing")
    assert story.index(("decision", "apply")) < story.index(("applied", None))
    assert ("alert", "resolved") in story and ("verified", "improved") in story
    assert stack.find(event="rolled_back") is None
    # resolved for restore_after_s: max_num_seqs goes back to the operator's 16
    wait_for(
        lambda: stack.find(load_started, event="restored", alert="InferdKVCacheThrashing"),
        60,
        "max_num_seqs restored",
        stack,
    )
    assert stack.engine_config()["max_num_seqs"] == 16
    metrics = stack.http.get(f"{stack.url('agent')}/metrics").text
    assert (
        'inferd_remediation_actions_total{action="lower_max_num_seqs",alert="InferdKVCacheThrashing",'
        f'result="applied"}} {float(len(values))}'
    ) in metrics


ENGINE_STARTUP_WINDOW_S = 10.0  # SupervisorConfig.healthy_after_s, the agent's default


def test_stalled_engine_core_is_restarted_by_the_agent(stack):
    """A hung engine core keeps its processes, so nothing exits: the server's /ready turns
    503 engine_stalled and the engine is restarted, by the supervisor's own readiness probe
    (after 30 s) or by InferdEngineDown reaching the agent, whichever comes first: here the
    rules run time-scaled, so usually the alert (tests/test_supervisor.py covers the probe)."""
    old_pid = stack.engine_pid()
    assert old_pid
    # the agent does not restart an engine inside its start-up window
    started = os.stat(f"/proc/{old_pid}").st_mtime
    time.sleep(max(0.0, started + ENGINE_STARTUP_WINDOW_S + 2 - time.time()))
    core = next(
        pid for pid in child_pids(old_pid) if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    )
    os.kill(core, signal.SIGSTOP)  # alive, steps nothing, says nothing
    try:
        wait_for(
            lambda: (
                stack.http.get(f"{stack.url('engine')}/ready").json().get("error", {}).get("code") == "engine_stalled"
            ),
            60,
            "/ready to say engine_stalled",
            stack,
        )
        wait_for(lambda: stack.engine_pid() not in (None, old_pid), 120, "the agent to restart the engine", stack)
        wait_for(
            lambda: stack.http.get(f"{stack.url('engine')}/ready").status_code == 200, 120, "the engine back", stack
        )
        agent_metrics = stack.http.get(f"{stack.url('agent')}/metrics").text
        assert metric_value(agent_metrics, "inferd_engine_restarts_total") >= 1
    finally:
        try:
            os.kill(core, signal.SIGKILL)  # never leave a stopped process behind
        except ProcessLookupError:
            pass


def test_fast_path_failure_falls_back_and_is_restored(stack):
    started = time.time()
    assert stack.engine_config()["mode"] == "fast"
    with Load(stack.url("engine"), workers=3, max_tokens=24) as load:
        wait_for(lambda: len(load.statuses) >= 3, 30, "requests in flight", stack)
        r = stack.http.post(
            f"{stack.url('engine')}/admin/fault", json={"kind": "fastpath"}, headers=stack.admin_headers
        )
        assert r.status_code == 200, r.text
        applied = wait_for(
            lambda: stack.find(started, event="applied", alert="InferdEngineFastPathFailing"),
            90,
            "InferdEngineFastPathFailing to reach the agent",
            stack,
        )
        assert applied["action"] == "fallback" and applied["new"] == {"mode": "fallback"}
        wait_for(
            lambda: stack.find(started, event="restored", alert="InferdEngineFastPathFailing"),
            120,
            "the fast path restored",
            stack,
        )
        assert stack.engine_config()["mode"] == "fast"
        served_after = len(load.statuses)
        wait_for(lambda: len(load.statuses) > served_after + 3, 30, "requests on the restored fast path", stack)
    assert set(load.statuses) == {200}, load.errors[:3]
    resolved = stack.find(started, event="alert", alert="InferdEngineFastPathFailing", status="resolved")
    restored = stack.find(started, event="restored", alert="InferdEngineFastPathFailing")
    assert restored["restored"] == {"mode": "fast"}
    assert resolved["ts"] + POLICY["restore_after_s"] <= restored["ts"] + 1.0
    failures = stack.query("sum(inferd_engine_fastpath_failures_total)")
    assert failures == 1
