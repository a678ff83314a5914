"""The scenario benchmark end to end, compressed (every duration x 1/30): the real stack
(agent/scenario/stack.py), the scenario's workload and recorder, the agent acting.

- control (30 minutes of steady load at production intervals, 60 s here): the agent
  takes no action, no alert fires, no request is lost, and the SLO attainment meets the
  scenario's own target;
- kv_thrash: the shift overruns the KV pool; the agent acts at least once, the records
  show max_num_seqs lowered from the default in force before, and the shift's KV
  page-fault rate while the lowered value is in force below its rate under the default;
  no request is lost.

With INFERD_SCENARIO_OUT=DIR each run's JSON is also written there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from inferd.agent.scenario.run import run_scenario
from inferd.agent.scenario.scenarios import SCENARIOS
from inferd.agent.scenario.stack import MissingBinary, binary, make_tiny_model

pytestmark = pytest.mark.slow

TIME_SCALE = 1 / 30


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    try:
        binary("prometheus")
        binary("prometheus-alertmanager", "alertmanager")
    except MissingBinary as exc:
        pytest.skip(str(exc))
    return make_tiny_model(tmp_path_factory.mktemp("scenario-model") / "tiny")


def run_with_agent(name: str, run_dir: Path, model: Path) -> dict:
    result = run_scenario(SCENARIOS[name], "agent", time_scale=TIME_SCALE, run_dir=run_dir, model=model)
    text = json.dumps(result, indent=1)
    (run_dir / f"{name}-agent.json").write_text(text)
    out = os.environ.get("INFERD_SCENARIO_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}-agent.json").write_text(text)
    return result


def test_control_with_the_agent_takes_no_action(model, tmp_path):
    scenario = SCENARIOS["control"]
    result = run_with_agent("control", tmp_path, model)
    s = result["summary"]
    assert s["requests"] > 0 and s["records"] > 0
    assert s["actions"] == 0, s["audit_events"]
    assert s["alerts_fired"] == [], s
    assert s["lost"] == 0, [r for r in result["requests"] if r["error"]][:3]
    assert s["attainment"] >= scenario.attainment_target, s


def test_kv_thrash_with_the_agent_lowers_max_num_seqs_and_the_faults_fall(model, tmp_path):
    scenario = SCENARIOS["kv_thrash"]
    result = run_with_agent("kv_thrash", tmp_path, model)
    s, records = result["summary"], result["records"]
    assert s["actions"] >= 1, (s, [r["actions"] for r in records if r["actions"]])
    assert s["lost"] == 0, [r for r in result["requests"] if r["error"]][:3]

    default = int(next(a.split("=")[1] for a in result["engine_args"] if a.startswith("--max-num-seqs=")))
    acted = s["first_action_s"]
    # A record's collectors run after its time stamp: one interval's slack either side of the action.
    slack = result["interval_s"]
    seen_before = {r["tunables"]["max_num_seqs"] for r in records if r["t"] < acted - slack and r["tunables"]}
    seen_after = {r["tunables"]["max_num_seqs"] for r in records if r["t"] > acted + slack and r["tunables"]}
    assert seen_before == {default}, seen_before
    assert min(seen_after) < default, seen_after

    # The fault rate during the shift, by the max_num_seqs in force at both ends of an interval.
    shift = next(p for p in result["phases"] if p["name"] == scenario.shift_phase)
    in_shift = [r for r in records if shift["start_s"] < r["t"] <= shift["start_s"] + shift["duration_s"]]
    faults = {"default": [0.0, 0.0], "lowered": [0.0, 0.0]}  # faults, seconds
    for before, after in zip(in_shift, in_shift[1:]):
        if None in (before["tunables"], after["tunables"], before["kv_page_faults"], after["kv_page_faults"]):
            continue
        knob = {before["tunables"]["max_num_seqs"], after["tunables"]["max_num_seqs"]}
        if len(knob) == 1 and after["kv_page_faults"] >= before["kv_page_faults"]:
            kind = "default" if knob == {default} else "lowered"
            faults[kind][0] += after["kv_page_faults"] - before["kv_page_faults"]
            faults[kind][1] += after["t"] - before["t"]
    rates = {kind: count / seconds if seconds else None for kind, (count, seconds) in faults.items()}
    assert rates["default"] and rates["lowered"] is not None, rates
    assert rates["lowered"] < rates["default"], rates
