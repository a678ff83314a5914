"""A scenario three ways, on recorded runs (no stack): the best static point, the
1-minute windows two runs share, the targets passing and failing with their margins,
the Markdown table, the driver's sweep (the default's run standing for the default
point) and the timeline PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferd.agent.scenario import ways
from inferd.agent.scenario.run import add_arguments, phases_out
from inferd.agent.scenario.scenarios import SCENARIOS
from inferd.agent.scenario.summary_table import (
    Point,
    best_static,
    checks,
    markdown,
    scenario_summary,
    windows,
    worst_window_delta,
)

SCALE = 1 / 30
INTERVAL = 10 * SCALE  # the recorder's interval at 1/30: a 1-minute window is 6 of them
SHIFT = 2.0


def fake_run(
    way: str,
    attainments: list[float],
    *,
    settings: dict | None = None,
    actions_at: tuple[float, ...] = (),
    lost: int = 0,
    alerts: tuple[str, ...] = (),
    recovery_s: float | None = 1.0,
    finished: int = 10,
) -> dict:
    """A run as run.py writes it: a record per interval with `finished` requests, of which
    round(attainment x finished) met the SLO; an `applied` audit event at each of `actions_at`."""
    records = []
    for k, a in enumerate(attainments, start=1):
        t = round(k * INTERVAL + 0.004, 6)  # a record lands a little after its tick
        acted = [{"event": "applied", "t": x, "new": {"max_num_seqs": 4}} for x in actions_at if t - INTERVAL < x <= t]
        records.append(
            {
                "t": t,
                "interval_s": INTERVAL,
                "offered_rps": 10.0,
                "served_rps": 9.0,
                "finished": finished,
                "met": round(a * finished),
                "attainment": round(a * finished) / finished,
                "kv_page_faults_per_s": 3.0 if a < 0.9 else 0.0,
                "tunables": {
                    "max_num_seqs": 4 if actions_at and t > actions_at[0] else (settings or {}).get("max_num_seqs", 16)
                },
                "alerts": [{"name": name, "state": "firing"} for name in alerts] if a < 0.9 else [],
                "actions": acted,
            }
        )
    met = sum(r["met"] for r in records)
    total = finished * len(records)
    return {
        "scenario": "kv_thrash",
        "way": way,
        "settings": settings or {},
        "seed": 0,
        "time_scale": SCALE,
        "interval_s": INTERVAL,
        "slo": {"ttft_s": 2.0, "tpot_s": 0.25, "attainment_target": 0.9},
        "phases": [
            {"name": "steady", "start_s": 0.0, "duration_s": SHIFT},
            {"name": "shift", "start_s": SHIFT, "duration_s": len(records) * INTERVAL - SHIFT},
        ],
        "records": records,
        "summary": {
            "attainment": met / total,
            "goodput_rps": met / (len(records) * INTERVAL),
            "recovery_s": recovery_s,
            "actions": len(actions_at),
            "lost": lost,
            "shed": 0,
            "requests": total,
            "alerts_fired": sorted(alerts),
            "first_action_s": min(actions_at, default=None),
        },
    }


# 30 intervals (10 s); the shift's trouble from interval 7 to 24 under the default
DEFAULT = [1.0] * 6 + [0.3] * 18 + [1.0] * 6
AGENT_GOOD = [1.0] * 6 + [0.3] + [0.9] * 17 + [1.0] * 6  # acts early in the shift
AGENT_WORSE = [1.0] * 6 + [0.3] * 3 + [0.2] * 15 + [1.0] * 6  # acting made it worse
STATIC_4 = [1.0] * 6 + [0.9] * 18 + [1.0] * 6


def by_check(found) -> dict:
    return {c.name: c for c in found}


def test_the_best_static_point_has_the_highest_attainment_ties_by_goodput():
    low = Point(fake_run("static", [0.5] * 30, settings={"max_num_seqs": 12}), {"max_num_seqs": 12})
    high = Point(fake_run("static", [0.9] * 30, settings={"max_num_seqs": 8}), {"max_num_seqs": 8})
    # the same attainment, more requests finished per second: the tie goes to goodput
    busier = Point(fake_run("static", [0.9] * 30, settings={"max_num_seqs": 4}, finished=20), {"max_num_seqs": 4})
    assert best_static([low, high]) is high
    assert best_static([low, high, busier]) is busier
    assert best_static([busier, high]) is busier  # not by order
    # a full tie: the default configuration's point, else the first
    run = fake_run("default", [0.9] * 30)
    default = Point(run, {"max_num_seqs": 16}, is_default=True)
    assert best_static([high, default]) is default
    assert best_static([high, Point(run, {"max_num_seqs": 12})]) is high
    with pytest.raises(ValueError):
        best_static([])


def test_windows_are_the_same_intervals_in_both_runs():
    run = fake_run("agent", DEFAULT)
    got = windows(run["records"], since=3.05, window_s=60 * SCALE, interval_s=INTERVAL)
    # the first interval boundary at or after 3.05 s is tick 10 (3.33 s); windows of 6 ticks up to tick 30
    assert [round(start / INTERVAL) for start, _, _ in got] == list(range(10, 25))
    assert all(finished == 60 for _, finished, _ in got)
    assert got[0][2] == 6 * 3  # ticks 11..16: 3 of 10 met in each
    assert got[-1][2] == 60  # ticks 25..30: all met
    # a short run after the action: one short window
    assert len(windows(run["records"], since=9.0, window_s=60 * SCALE, interval_s=INTERVAL)) == 1


def test_the_agent_worse_in_one_window_is_caught_with_its_margin():
    default = fake_run("default", DEFAULT)
    dip = list(AGENT_GOOD)
    dip[27] = 0.0  # tick 28, after both have recovered: 0 of 10 met where the default met 10
    agent = fake_run("agent", dip, actions_at=(3.0,))
    delta, start = worst_window_delta(agent, default, 3.0, 60 * SCALE)
    # the last window, ticks 25..30: 50 of 60 against 60 of 60 (earlier ones with tick 28
    # also hold the shift, where the agent did better)
    assert start == pytest.approx(24 * INTERVAL)
    assert delta == pytest.approx(50 / 60 - 1)
    assert worst_window_delta(fake_run("agent", DEFAULT, actions_at=(3.0,)), default, 3.0, 2.0)[0] == 0


def finishing_nothing(run: dict) -> dict:
    for record in run["records"]:
        record.update(finished=0, met=0, attainment=None)
    return run


def test_a_way_that_finishes_nothing_in_a_window_counts_zero_there():
    # a hung engine: the default finishes nothing after the action, the agent everything
    hung = finishing_nothing(fake_run("default", [1.0] * 30))
    agent = fake_run("agent", [1.0] * 30, actions_at=(3.0,))
    assert worst_window_delta(agent, hung, 3.0, 60 * SCALE)[0] == pytest.approx(1.0)
    # and the other way round: an agent whose engine finishes nothing is caught
    dead = finishing_nothing(fake_run("agent", [1.0] * 30, actions_at=(3.0,)))
    assert worst_window_delta(dead, fake_run("default", [1.0] * 30), 3.0, 60 * SCALE)[0] == pytest.approx(-1.0)
    # neither finished anything: no window to compare
    assert worst_window_delta(dead, hung, 3.0, 60 * SCALE) == (None, None)


def test_targets_pass_for_an_agent_that_helps():
    default = fake_run("default", DEFAULT)
    best = fake_run("static", STATIC_4, settings={"max_num_seqs": 4})
    agent = fake_run("agent", AGENT_GOOD, actions_at=(3.0,), recovery_s=1.0)
    found = by_check(checks(default, best, agent, is_control=False))
    assert all(c.passed for c in found.values()), found
    d, a, b = (r["summary"]["attainment"] for r in (default, agent, best))
    assert found["vs_default"].margin == pytest.approx(a - (d + 0.20))
    assert found["vs_best_static"].margin == pytest.approx(a - (b - 0.05))
    assert found["window_vs_default"].value == 0  # the last window: both recovered
    assert found["window_vs_default"].margin == pytest.approx(0.02)
    assert found["lost"].margin == 0
    assert found["recovery"].threshold == pytest.approx(180 * SCALE) and found["recovery"].margin == pytest.approx(5.0)


def test_targets_fail_for_an_agent_that_makes_it_worse():
    default = fake_run("default", DEFAULT)
    best = fake_run("static", STATIC_4, settings={"max_num_seqs": 4})
    agent = fake_run("agent", AGENT_WORSE, actions_at=(3.0,), lost=2, recovery_s=None)
    found = by_check(checks(default, best, agent, is_control=False))
    failed = {name for name, c in found.items() if c.passed is False}
    assert failed == {"vs_default", "vs_best_static", "window_vs_default", "lost", "recovery"}
    assert found["window_vs_default"].value == pytest.approx(-0.1)  # 2 of 10 against 3 of 10
    assert found["window_vs_default"].margin == pytest.approx(-0.08)
    assert found["vs_default"].margin < -0.2 and found["lost"].margin == -2
    assert found["recovery"].note == "not back by the end of the run"
    summary = scenario_summary(
        Point(default, {}, "d.json"),
        [Point(default, {"max_num_seqs": 16}, "d.json", is_default=True), Point(best, {"max_num_seqs": 4}, "s4.json")],
        Point(agent, {}, "a.json"),
        is_control=False,
    )
    assert summary["passed"] is False
    assert summary["ways"]["best_static"]["settings"] == {"max_num_seqs": 4}
    text = markdown([summary])
    assert "**FAIL**" in text and "| kv_thrash | best static | max_num_seqs=4 |" in text
    assert "-8.0 pts" in text  # the window's margin
    assert "2 points swept" in text


def test_vs_default_does_not_apply_where_the_default_meets_its_target():
    default = fake_run("default", [1.0] * 30)
    agent = fake_run("agent", [1.0] * 30)
    found = by_check(checks(default, default, agent, is_control=False))
    assert found["vs_default"].passed is None and "meets its target" in found["vs_default"].note
    assert found["window_vs_default"].passed is None  # no action: nothing after it
    assert found["vs_best_static"].passed is True


def test_the_control_wants_no_action_and_no_alert():
    default = fake_run("default", [1.0] * 30)
    quiet = fake_run("agent", [1.0] * 30)
    assert all(c.passed for c in checks(default, default, quiet, is_control=True))
    noisy = fake_run("agent", [1.0] * 10 + [0.5] + [1.0] * 19, actions_at=(3.5,), alerts=("InferdKVCacheThrashing",))
    found = by_check(checks(default, default, noisy, is_control=True))
    assert (found["actions"].passed, found["actions"].margin) == (False, -1)
    assert found["alerts"].passed is False and found["alerts"].note == "InferdKVCacheThrashing"
    assert found["lost"].passed is True


def test_the_sweep_is_the_product_of_the_knob_values_and_finds_the_default():
    scenario = SCENARIOS["kv_thrash"]
    assert ways.sweep_points(scenario) == [{"max_num_seqs": n} for n in (4, 8, 12, 16)]
    assert ways.default_values(scenario) == {"max_num_seqs": 16}
    assert ways.run_name("kv_thrash", "static", {"max_num_seqs": 8}) == "kv_thrash-static-max_num_seqs=8"


def test_the_driver_runs_each_way_once_and_writes_the_table(tmp_path, monkeypatch):
    calls = []
    canned = {
        ("default", None): DEFAULT,
        ("static", 4): STATIC_4,
        ("static", 8): [1.0] * 6 + [0.6] * 18 + [1.0] * 6,
        ("static", 12): [1.0] * 6 + [0.4] * 18 + [1.0] * 6,
        ("agent", None): AGENT_GOOD,
    }

    def run_scenario(scenario, way, settings, *, time_scale, run_dir, model, interval_s, seed):
        calls.append((way, settings.get("max_num_seqs")))
        run = fake_run(way, canned[way, settings.get("max_num_seqs")], settings=settings)
        if way == "agent":
            run = fake_run(way, AGENT_GOOD, actions_at=(3.0,))
        run["seed"] = seed
        run["phases"] = phases_out(scenario.scaled_phases(time_scale))  # what --resume compares rates with
        return run

    monkeypatch.setattr("inferd.agent.scenario.run.run_scenario", run_scenario)
    summary = ways.run_ways(SCENARIOS["kv_thrash"], tmp_path, time_scale=SCALE, model=Path("unused"), plot=False)
    # four points swept, three of them run: max_num_seqs=16 is the default, run once
    assert calls == [("default", None), ("static", 4), ("static", 8), ("static", 12), ("agent", None)]
    assert len(summary["sweep"]) == 4 and summary["sweep"][-1]["is_default"]
    assert summary["ways"]["best_static"]["settings"] == {"max_num_seqs": 4}
    assert summary["passed"], summary["checks"]
    names = sorted(p.name for p in tmp_path.glob("*.json"))
    assert names == [
        "kv_thrash-agent.json",
        "kv_thrash-default.json",
        "kv_thrash-static-max_num_seqs=12.json",
        "kv_thrash-static-max_num_seqs=4.json",
        "kv_thrash-static-max_num_seqs=8.json",
    ]
    # --resume reuses what matches and runs nothing
    calls.clear()
    again = ways.run_ways(
        SCENARIOS["kv_thrash"], tmp_path, time_scale=SCALE, model=Path("unused"), plot=False, resume=True
    )
    assert calls == [] and again == summary
    ways.write_summary(tmp_path, [summary])
    combined = json.loads((tmp_path / "ways.json").read_text())
    assert combined["scenarios"][0]["checks"] == summary["checks"]
    assert "| kv_thrash | agent | default |" in (tmp_path / "summary.md").read_text()


def test_ways_all_refuses_a_way_or_a_setting(tmp_path, capsys):
    import argparse

    from inferd.agent.scenario.run import run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["kv_thrash", "control", "--ways", "all", "--way", "agent", "--out", str(tmp_path)])
    assert run(args) == 2 and "no --way or --set" in capsys.readouterr().err
    args = parser.parse_args(["kv_thrash", "control", "--out", str(tmp_path / "x.json")])
    assert run(args) == 2 and "several with --ways all" in capsys.readouterr().err


def test_the_timeline_png_is_written(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib draws the timeline")
    from inferd.agent.scenario.timeline_plot import alert_spans, events, knobs, plot

    default = fake_run("default", DEFAULT, alerts=("InferdKVCacheThrashing",))
    default["records"][8]["actions"] = [
        {"event": "decision", "result": "dry_run", "t": 2.9, "new": {"max_num_seqs": 4}}
    ]
    best = fake_run("static", STATIC_4, settings={"max_num_seqs": 4}, alerts=("InferdKVCacheThrashing",))
    agent = fake_run("agent", AGENT_GOOD, actions_at=(3.0,), alerts=("InferdKVCacheThrashing",))
    assert knobs([default, best, agent]) == ["max_num_seqs"]
    spans = alert_spans(default["records"])["InferdKVCacheThrashing"]
    assert len(spans) == 1 and spans[0][0] == pytest.approx(6 * INTERVAL, abs=0.01)
    assert spans[0][1] == pytest.approx(18 * INTERVAL, abs=0.01)
    assert events(default["records"]) == [(2.9, "dry_run", "max_num_seqs=4")]
    path = tmp_path / "kv_thrash.png"
    plot([default, best, agent], path, ["default", "best static", "agent"])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_a_knob_with_named_values_is_drawn_by_index():
    from inferd.agent.scenario.timeline_plot import knob_series

    records = [{"tunables": {"mode": "fast"}}, {"tunables": None}, {"tunables": {"mode": "fallback"}}]
    values, label = knob_series(records, "mode")
    assert values[0] == 1.0 and values[2] == 0.0 and values[1] != values[1]  # NaN where nothing was read
    assert label == "mode (0: fallback, 1: fast)"
    assert knob_series([{"tunables": {"max_num_seqs": 8}}], "max_num_seqs") == ([8.0], "max_num_seqs")
