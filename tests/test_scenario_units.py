"""The scenario benchmark's parts on their own: the workload's trace (arrivals, prompts,
one seed one trace), the attainment bookkeeping on recorded requests, the recorder's
intervals and its collectors failing one at a time, and the summary's recovery time and
worst window. No stack runs here (tests/test_scenario_e2e.py runs one)."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from inferd.agent.scenario.recorder import FAULTS, PREEMPTIONS, Endpoints, Recorder, engine_counters, phase_at
from inferd.agent.scenario.run import check_way, parse_scale, recovery_s, summarize, worst_window
from inferd.agent.scenario.scenarios import SCENARIOS, engine_args_with
from inferd.agent.scenario.workload import Attainment, Phase, Sent, Workload, phase_starts, plan
from inferd.engine.bench.goodput import RequestRecord
from inferd.engine.bench.slo_classes import SloClass

PHASES = [
    Phase("steady", 20.0, rate=2.0, prompt_len=(8, 16), max_tokens=16),
    Phase("shift", 10.0, rate=5.0, prompt_len=(30, 40), max_tokens=40, slo_class="interactive"),
    Phase("quiet", 5.0, rate=0.0, prompt_len=(1, 1), max_tokens=1),
]
SLO = SloClass("s", 1.0, ttft_s=1.0, tpot_s=0.1)


def test_the_trace_has_each_phase_s_count_times_and_lengths():
    trace = plan(PHASES, seed=7)
    counts = Counter(p.phase for p in trace)
    assert counts == {"steady": 40, "shift": 50}  # round(rate x duration), none in a phase of rate 0
    assert [p.t for p in trace] == sorted(p.t for p in trace)
    for p in trace:
        if p.phase == "steady":
            assert 0 <= p.t <= 20 and 8 <= len(p.prompt) <= 16 and p.max_tokens == 16 and p.slo_class is None
        else:
            assert 20 <= p.t <= 30 and 30 <= len(p.prompt) <= 40 and p.max_tokens == 40
            assert p.slo_class == "interactive"
    # the lengths are drawn, not fixed: noise
    assert len({len(p.prompt) for p in trace if p.phase == "steady"}) > 3
    assert phase_starts(PHASES) == {"steady": 0.0, "shift": 20.0, "quiet": 30.0}


def test_one_seed_is_one_trace_whichever_way_it_runs():
    assert plan(PHASES, seed=3) == plan(PHASES, seed=3)
    assert plan(PHASES, seed=3) != plan(PHASES, seed=4)


def test_poisson_gaps_look_exponential():
    trace = plan([Phase("p", 2000.0, rate=2.0, prompt_len=(1, 1), max_tokens=1)], seed=1)
    gaps = [b.t - a.t for a, b in zip(trace, trace[1:])]
    mean = sum(gaps) / len(gaps)
    cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean
    assert mean == pytest.approx(0.5, rel=0.05)
    assert cv == pytest.approx(1.0, abs=0.1)  # exponential gaps: coefficient of variation 1


def test_scaling_a_phase_scales_its_duration_only():
    phase = PHASES[1].scaled(1 / 30)
    assert phase.duration_s == pytest.approx(10 / 30) and phase.rate == 5.0 and phase.prompt_len == (30, 40)
    with pytest.raises(ValueError, match="prompt_len"):
        Phase("x", 1.0, rate=1.0, prompt_len=(5, 2), max_tokens=1)


def done(
    t: float, status: int = 200, ttft: float = 0.5, e2e: float = 1.0, tokens: int = 11, error: str = "", phase="p"
) -> Sent:
    record = RequestRecord("default", 10, status, ttft, [], e2e, tokens if status == 200 else 0, error)
    return Sent(t, phase, record, done=True)


def recorded() -> list[Sent]:
    return [
        done(0.0),  # met: TTFT 0.5, TPOT 0.05
        done(0.1, ttft=1.5, e2e=2.0),  # TTFT missed, TPOT 0.05 met
        done(0.2, ttft=0.2, e2e=3.2),  # TPOT 0.3 missed
        done(0.3, tokens=1, e2e=0.6),  # one token: no TPOT, met
        done(0.4, status=429, ttft=math.nan, e2e=0.01, error="HTTP 429: busy"),  # shed, not lost
        done(0.5, status=500, ttft=math.nan, e2e=0.01, error="HTTP 500: boom"),  # lost
        done(0.6, status=0, ttft=math.nan, e2e=0.01, error="ConnectError: refused"),  # lost
        done(0.7, ttft=0.3, e2e=0.4, error="stream error: engine died"),  # 200 but failed mid-stream: lost
    ]


def test_attainment_bookkeeping_on_recorded_requests():
    a = Attainment.of(recorded(), SLO)
    assert (a.finished, a.completed, a.met, a.ttft_met, a.tpot_met) == (8, 4, 2, 3, 3)
    assert (a.lost, a.shed) == (3, 1)
    assert a.attainment == 2 / 8  # over every request finished, as goodput.py's attainment
    summaries = [s.summary(SLO) for s in recorded()]
    assert [s["met"] for s in summaries] == [True, False, False, True, False, False, False, False]
    assert summaries[2]["tpot"] == pytest.approx(0.3) and summaries[3]["tpot"] is None
    assert summaries[6]["status"] == 0 and summaries[6]["error"].startswith("ConnectError")
    assert Attainment().attainment is None


def recorder_with(handler, workload: Workload | None = None) -> tuple[Recorder, httpx.AsyncClient]:
    workload = workload or Workload("http://engine", [])
    workload.started = 0.0
    endpoints = Endpoints("http://engine", "http://prometheus", "http://agent", "token")
    recorder = Recorder(endpoints, workload, PHASES, SLO, interval_s=1.0, unix_start=1000.0)
    return recorder, httpx.AsyncClient(transport=httpx.MockTransport(handler))


EXPOSITION = """# TYPE inferd_kv_page_faults counter
inferd_kv_page_faults_total{kind="swap_in"} 3
inferd_kv_page_faults_total{kind="recompute"} 4
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="tiny"} 2
"""


def test_engine_counters_sum_every_kind():
    assert engine_counters(EXPOSITION) == {FAULTS: 7.0, PREEMPTIONS: 2.0}
    with pytest.raises(KeyError, match="num_preemptions"):
        engine_counters(EXPOSITION.split("# TYPE vllm")[0])


def answers(metrics_status: int = 200, faults: float = 7.0):
    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/metrics":
            text = EXPOSITION.replace('recompute"} 4', f'recompute"}} {faults - 3:g}')
            return httpx.Response(metrics_status, text=text if metrics_status == 200 else "down")
        if path == "/admin/config":
            assert request.headers["authorization"] == "Bearer token"
            return httpx.Response(200, json={"config": {"max_num_seqs": 16}})
        if path == "/api/v1/alerts":
            alert = {"labels": {"alertname": "InferdKVCacheThrashing"}, "state": "firing", "activeAt": "x"}
            return httpx.Response(200, json={"data": {"alerts": [alert]}})
        if path == "/v1/actions":
            records = [
                {"ts": 999.0, "event": "started"},  # before the run: not a decision of it
                {"ts": 1002.5, "event": "applied", "new": {"max_num_seqs": 4}},
            ]
            return httpx.Response(200, json={"records": records})
        return httpx.Response(404)

    return handler


def test_a_failing_collector_leaves_a_hole_not_a_gap():
    async def go():
        recorder, client = recorder_with(answers(metrics_status=500))
        async with client:
            return await recorder.record(client)

    record = asyncio.run(go())
    assert record["kv_page_faults"] is None and record["preemptions"] is None
    assert set(record["errors"]) == {"engine_metrics"} and "500" in record["errors"]["engine_metrics"]
    assert record["tunables"] == {"max_num_seqs": 16}
    assert record["alerts"] == [{"name": "InferdKVCacheThrashing", "state": "firing", "active_at": "x"}]
    assert [a["event"] for a in record["actions"]] == ["applied"] and record["actions"][0]["t"] == 2.5


def test_records_count_requests_in_the_interval_they_finish_and_actions_once():
    workload = Workload("http://engine", [])

    async def go():
        recorder, client = recorder_with(answers(faults=7.0), workload)
        async with client:
            workload.sent.extend([done(0.1), done(0.2, ttft=3.0, e2e=3.5)])
            pending = Sent(0.3, "steady", RequestRecord("default"))
            workload.sent.append(pending)
            workload.started = time.monotonic() - 1.0  # t = 1
            first = await recorder.record(client)
            pending.record = RequestRecord("default", 10, 200, 0.2, [], 0.7, 11)
            pending.done = True
            workload.started -= 1.0  # t = 2
            second = await recorder.record(client)
        return first, second

    first, second = asyncio.run(go())
    assert (first["finished"], first["met"], first["in_flight"], first["attainment"]) == (2, 1, 1, 0.5)
    assert first["offered_rps"] == pytest.approx(3.0, rel=0.05) and first["served_rps"] == pytest.approx(2, rel=0.05)
    assert (second["finished"], second["met"], second["in_flight"], second["attainment"]) == (1, 1, 0, 1.0)
    assert second["offered_rps"] == 0
    assert second["kv_page_faults_per_s"] == 0.0  # same counters: no fault in between
    assert len(first["actions"]) == 1 and second["actions"] == []  # each audit record once
    assert phase_at(PHASES, 25.0) == "shift" and phase_at(PHASES, 99.0) is None


def rec(t: float, attainment: float | None, finished: int = 10, in_flight: int = 0, interval: float = 1.0) -> dict:
    met = round(attainment * finished) if attainment is not None else 0
    return {
        "t": t,
        "interval_s": interval,
        "attainment": attainment,
        "finished": finished if attainment is not None else 0,
        "met": met,
        "in_flight": in_flight,
    }


def test_recovery_is_from_the_shift_until_every_later_interval_meets_the_target():
    records = [rec(1, 1.0), rec(2, 0.2), rec(3, 0.95), rec(4, 0.5), rec(5, 0.9), rec(6, 1.0)]
    assert recovery_s(records, since=1.0, target=0.9) == 3.0  # the last miss ends at t = 4
    assert recovery_s(records[:4], since=1.0, target=0.9) is None  # still missing at the end
    assert recovery_s([rec(2, 1.0), rec(3, 0.9)], since=1.0, target=0.9) == 0.0
    # an interval where nothing finished says nothing: its requests count where they finish
    assert recovery_s([rec(2, None, in_flight=5), rec(3, 1.0)], since=1.0, target=0.9) == 0.0
    assert recovery_s([rec(2, None, in_flight=5), rec(3, 0.5), rec(4, 1.0)], since=1.0, target=0.9) == 2.0


def test_worst_window_after_the_first_action():
    records = [rec(t, a) for t, a in enumerate([1.0, 0.0, 0.5, 1.0, 1.0, 0.8, 1.0], start=1)]
    # windows of 2 s from t = 2 (the action): [0.5, 1.0] 0.75, [1.0, 1.0] 1, [1.0, 0.8] 0.9, [0.8, 1.0] 0.9
    assert worst_window(records, since=2.0, window_s=2.0) == pytest.approx(0.75)
    assert worst_window(records, since=5.0, window_s=10.0) == pytest.approx(0.9)  # only a short tail left
    assert worst_window(records, since=99.0, window_s=2.0) is None


def test_the_summary_counts_actions_alerts_and_lost_requests():
    scenario = SCENARIOS["kv_thrash"]
    phases = scenario.scaled_phases(1 / 30)
    shift = phase_starts(phases)["shift"]
    records = [
        {**rec(shift - 1, 1.0), "alerts": [], "actions": []},
        {
            **rec(shift + 2, 0.1),
            "alerts": [{"name": "InferdKVCacheThrashing", "state": "firing"}, {"name": "Other", "state": "pending"}],
            "actions": [
                {"event": "decision", "result": "apply", "t": shift + 1.5},
                {"event": "applied", "t": shift + 1.5},
            ],
        },
        {**rec(shift + 4, 1.0), "alerts": [], "actions": []},
    ]
    summary = summarize(scenario, phases, recorded(), records, 1 / 30)
    assert summary["requests"] == 8 and summary["lost"] == 3 and summary["shed"] == 1
    assert summary["actions"] == 1 and summary["first_action_s"] == shift + 1.5
    assert summary["alerts_fired"] == ["InferdKVCacheThrashing"]  # pending is not fired
    assert summary["recovery_s"] == pytest.approx(2.0)
    expected = Attainment.of(recorded(), scenario.slo)  # the scenario's own targets
    assert summary["attainment"] == expected.met / 8
    assert summary["goodput_rps"] == pytest.approx(expected.met / scenario.duration_s * 30)


def test_static_settings_replace_the_default_s_option():
    args = engine_args_with(["--kv-cache-bytes=1", "--max-num-seqs=16", "--log-level=WARNING"], {"max_num_seqs": 8})
    assert args == ["--kv-cache-bytes=1", "--log-level=WARNING", "--max-num-seqs=8"]
    with pytest.raises(ValueError, match="not a tunable"):
        engine_args_with([], {"kv_cache_bytes": 1})
    with pytest.raises(ValueError, match="max_num_seqs"):
        engine_args_with([], {"max_num_seqs": 0})
    with pytest.raises(ValueError, match="--way static needs"):
        check_way("static", {})
    with pytest.raises(ValueError, match="--set is for --way static"):
        check_way("agent", {"max_num_seqs": 8})
    assert parse_scale("1/30") == pytest.approx(1 / 30) and parse_scale("0.5") == 0.5


def test_every_scenario_scales_its_policy_durations():
    for scenario in SCENARIOS.values():
        policy = scenario.scaled_policy(1 / 30)
        assert policy["cooldown_s"] == pytest.approx(scenario.policy["cooldown_s"] / 30)
        assert policy["step_fraction"] == scenario.policy["step_fraction"]
    assert SCENARIOS["kv_thrash"].shift_phase == "shift" and SCENARIOS["control"].shift_phase is None


def test_faults_are_checked_and_injected_as_their_phase_starts():
    from dataclasses import replace

    from inferd.agent.scenario.run import inject_faults
    from inferd.agent.scenario.scenarios import Fault

    with pytest.raises(ValueError, match="fault kind"):
        Fault("meteor", "shift")
    for kind, seconds in (("slow_swap", 0.0), ("kill", 0.01)):
        with pytest.raises(ValueError, match="seconds_per_block"):
            Fault(kind, "shift", seconds_per_block=seconds)
    with pytest.raises(ValueError, match="no phase 'later'"):
        replace(SCENARIOS["fastpath_fault"], faults=(Fault("fastpath", "later"),))

    posted: list[tuple[float, dict]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posted.append((time.monotonic(), {"path": request.url.path, "body": request.content.decode()}))
        return httpx.Response(200, json={"injected": "fastpath"})

    class FakeStack:
        admin_headers = {"Authorization": "Bearer t"}

        @staticmethod
        def url(name: str) -> str:
            return "http://engine.test"

    phases = [Phase("steady", 0.2, 1.0, (1, 2), 1), Phase("shift", 0.2, 1.0, (1, 2), 1)]

    injected: list[dict] = []

    async def main() -> float:
        started = time.monotonic()
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            await inject_faults(FakeStack(), http, (Fault("fastpath", "shift"),), phases, started, injected)  # type: ignore[arg-type]
        return started

    started = asyncio.run(main())
    assert len(posted) == 1
    at, request = posted[0]
    assert request == {"path": "/admin/fault", "body": '{"kind":"fastpath"}'}
    assert at - started >= 0.2  # not before the shift phase starts
    assert injected == [{"kind": "fastpath", "phase": "shift", "t": pytest.approx(0.2, abs=0.1), "status": 200}]


def test_hang_stops_and_kill_ends_the_engines_process_group():
    from inferd.agent.scenario.run import inject
    from inferd.agent.scenario.scenarios import Fault

    # A stand-in engine: a shell whose child shares its process group, as inferd serve's
    # engine core shares the API server's.
    engine = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)

    class FakeStack:
        @staticmethod
        def engine_pid() -> int:
            return engine.pid

    def state(pid: int) -> str:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    try:
        assert asyncio.run(inject(FakeStack(), None, Fault("hang", "shift"))) == {"pid": engine.pid}  # type: ignore[arg-type]
        deadline = time.monotonic() + 5
        while state(engine.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state(engine.pid) == "T"  # stopped: alive, answering nothing
        assert asyncio.run(inject(FakeStack(), None, Fault("kill", "shift"))) == {"pid": engine.pid}  # type: ignore[arg-type]
        assert engine.wait(5) == -signal.SIGKILL
    finally:
        if engine.poll() is None:
            os.killpg(engine.pid, signal.SIGKILL)
            engine.wait()


def test_the_clients_patience_follows_the_workloads_length():
    from inferd.agent.scenario.workload import request_timeout

    def phases(seconds: float) -> list[Phase]:
        return [Phase("steady", seconds / 2, 1.0, (1, 2), 1), Phase("shift", seconds / 2, 1.0, (1, 2), 1)]

    assert request_timeout(phases(70)) == 70  # a compressed run: a hung request is lost soon after it
    assert request_timeout(phases(10)) == 60
    assert request_timeout(phases(2700)) == 300


def test_the_stacks_alert_rules_take_overrides_before_the_time_scale(tmp_path):
    from inferd.agent.scenario.stack import Stack

    stack = Stack(
        tmp_path,
        time_scale=1 / 4.5,
        engine_args=[],
        policy={},
        alert_params={"thresholds.ttft_p99_slo_seconds": 0.5, "durations.engine_down_for": "1h"},
    )
    stack.write_configs()
    stack.http.close()
    rules = (tmp_path / "alerts" / "rules.yml").read_text()
    assert "[26s667ms]))) > 0.5" in rules  # the scenario's TTFT target; the 2m window scaled
    assert "for: 13m20s" in rules  # an hour, scaled: InferdEngineDown's
    assert "ms" in (tmp_path / "prometheus.yml").read_text().split("scrape_interval:")[1].split("\n")[0]


def test_watched_queries_come_from_prometheus_into_each_record():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/query":
            query = request.url.params["query"]
            result = {
                "avg(DCGM_FI_PROF_SM_ACTIVE)": [{"value": [1, "0.42"]}, {"value": [1, "0.61"]}],
                "sum(vllm:num_requests_waiting)": [{"value": [1, "NaN"]}],
            }[query]
            return httpx.Response(200, json={"status": "success", "data": {"result": result}})
        return answers()(request)

    async def go(watch):
        recorder, client = recorder_with(handler)
        recorder.watch = watch
        async with client:
            return await recorder.record(client)

    record = asyncio.run(go({"sm_active": "avg(DCGM_FI_PROF_SM_ACTIVE)", "waiting": "sum(vllm:num_requests_waiting)"}))
    assert record["watch"] == {"sm_active": 0.61, "waiting": None}  # the largest finite sample
    assert "watch" not in asyncio.run(go({}))  # nothing watched: no field


def test_the_agent_collects_gpu_metrics_only_where_the_scenario_reads_them(tmp_path):
    from inferd.agent.scenario.stack import Stack

    def collectors_off(**options) -> list[str]:
        stack = Stack(tmp_path, time_scale=1.0, engine_args=[], policy={}, **options)
        stack.http.close()
        argv = stack.agent_argv(tmp_path / "model")
        return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--no-collector"]

    assert collectors_off() == ["gpu", "ebpf"]
    assert collectors_off(gpu_metrics=True) == ["ebpf"]
