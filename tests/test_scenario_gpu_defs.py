"""The GPU scenarios (agent/scenario/gpu_scenarios.py) as data, their calibration's
command lines and rate choice, and `inferd bench scenario --shift-rate`. Nothing starts
an engine or a stack here."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from inferd.agent.cli import command_parser
from inferd.agent.remediation_rules import PolicyConfig
from inferd.agent.scenario import run as scenario_run
from inferd.agent.scenario import ways
from inferd.agent.scenario.gpu_scenarios import (
    CALIBRATIONS,
    GPU_SCENARIOS,
    KV_BYTES_PER_TOKEN,
    TOKENS_PER_WORD,
    calibration_args,
    capacity,
    choose_shift_rate,
    main,
    shift_of,
)
from inferd.agent.scenario.run import phases_out
from inferd.agent.scenario.scenarios import SCENARIOS, engine_args_with
from inferd.agent.scenario.ways import default_values, run_name, sweep_points, with_shift_rate
from inferd.agent.scenario.workload import plan
from inferd.engine.config import validate_tunable
from inferd.engine.model.make_model import PRESETS
from inferd.engine.server.cli import engine_config_from_args

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("gpu_kv_thrash", "gpu_ttft_long_prompts", "gpu_underused")
BLOCK = 16


def engine_config(args):
    parsed = command_parser("serve").parse_args(["--model", "/nonexistent", *args])
    return parsed, engine_config_from_args(parsed, "/nonexistent")


def params() -> dict:
    return yaml.safe_load((ROOT / "alerts" / "params.yml").read_text())


def seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(duration[:-1]) * units[duration[-1]]


def blocks(tokens: int) -> int:
    return -(-tokens // BLOCK)


def test_the_gpu_scenarios_are_registered_with_a_shift_and_the_8b_preset():
    assert set(NAMES) <= set(SCENARIOS) and set(GPU_SCENARIOS) == set(NAMES)
    for name in NAMES:
        s = SCENARIOS[name]
        assert s is GPU_SCENARIOS[name] and s.name == name
        assert [p.name for p in s.phases] == ["steady", "shift", "recovery"] and s.shift_phase == "shift"
        assert s.model_preset == "llama3-8b-shape" and s.model_preset in PRESETS
        # one way is at most 5 minutes of workload at time scale 1/2
        assert s.duration_s * 0.5 <= 300
        assert 0 < s.attainment_target <= 1 and s.ttft_s > 0 and s.tpot_s > 0


def test_both_import_orders_register_them():
    for first in ("inferd.agent.scenario.gpu_scenarios", "inferd.agent.scenario.scenarios"):
        code = f"import {first}; from inferd.agent.scenario.scenarios import SCENARIOS; print(sorted(SCENARIOS))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
        assert all(name in out.stdout for name in NAMES), out


def test_sweep_values_are_valid_tunables_and_hold_the_default_and_the_better_value():
    for name in NAMES:
        s, calibration = GPU_SCENARIOS[name], CALIBRATIONS[name]
        for knob, values in s.sweep.items():
            for value in values:
                validate_tunable(knob, value)
        defaults = default_values(s)
        (knob, better), *_ = calibration.better.items()
        assert knob in s.sweep and better in s.sweep[knob] and defaults[knob] in s.sweep[knob]
        assert defaults[knob] != better
        assert {knob: better} in sweep_points(s)
        assert run_name(name, "static", {knob: better}) == f"{name}-static-{knob}={better}"


def test_engine_args_parse_with_the_engine_s_own_parser():
    for name in NAMES:
        s = GPU_SCENARIOS[name]
        parsed, config = engine_config(s.engine_args)
        assert parsed.served_model_name == "tiny"  # the runner's workload asks for "tiny"
        assert config.load_format == "dummy" and config.kv_cache_bytes > 0
        (knob, better), *_ = CALIBRATIONS[name].better.items()
        _, with_better = engine_config(engine_args_with(s.engine_args, {knob: better}))
        assert getattr(with_better, knob) == better and getattr(config, knob) != better


def test_kv_bytes_per_token_is_the_8b_shape_s():
    shape = PRESETS["llama3-8b-shape"]
    head_dim = shape.get("head_dim") or shape["hidden_size"] // shape["num_attention_heads"]
    assert KV_BYTES_PER_TOKEN == 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * head_dim * 2


def test_the_thrash_shift_overruns_the_pool_at_the_default_and_fits_at_the_better_value():
    s = GPU_SCENARIOS["gpu_kv_thrash"]
    _, config = engine_config(s.engine_args)
    pool = config.kv_cache_bytes // (KV_BYTES_PER_TOKEN * BLOCK)
    shift = shift_of(s)
    midway = blocks(sum(shift.prompt_len) // 2 + shift.max_tokens // 2)
    better = CALIBRATIONS["gpu_kv_thrash"].better["max_num_seqs"]
    assert config.max_num_seqs * midway > 2 * pool  # the default's seats hold twice the pool and more
    assert better * midway < 0.9 * pool  # the better value's fit, below the alert's 90 % full
    steady = s.phases[0]
    assert steady.rate * blocks(steady.prompt_len[1] + steady.max_tokens) * 4 < pool  # no thrashing before the shift


def test_the_ttft_shift_never_fills_the_pool_so_the_rule_raises_the_chunk():
    s = GPU_SCENARIOS["gpu_ttft_long_prompts"]
    _, config = engine_config(s.engine_args)
    pool = config.kv_cache_bytes // (KV_BYTES_PER_TOKEN * BLOCK)
    shift = shift_of(s)
    # every seat holding the longest prompt stays under the rule's KV-bound share (0.9)
    assert config.max_num_seqs * blocks(shift.prompt_len[1] + shift.max_tokens) < 0.9 * pool
    assert config.max_num_batched_tokens == 256 < shift.prompt_len[0]


def test_the_policies_take_the_intended_first_step():
    thrash = PolicyConfig.from_dict(dict(GPU_SCENARIOS["gpu_kv_thrash"].scaled_policy(0.5)))
    assert thrash.max_num_seqs.lower(32, thrash.step_fraction) == 8
    assert thrash.verify_window_s == 60
    ttft = PolicyConfig.from_dict(dict(GPU_SCENARIOS["gpu_ttft_long_prompts"].scaled_policy(0.5)))
    steps = [256]
    while len(steps) < 4:
        steps.append(ttft.max_num_batched_tokens.higher(steps[-1], ttft.step_fraction))
    assert steps == [256, 512, 1024, 2048]


@pytest.mark.parametrize(
    ("name", "window", "for_"),
    [
        ("gpu_kv_thrash", "kv_thrashing_window", "kv_thrashing_for"),
        ("gpu_ttft_long_prompts", "ttft_window", "ttft_for"),
    ],
)
def test_the_shift_outlasts_the_alert_the_group_wait_and_one_verification(name, window, for_):
    """At production intervals (any time scale multiplies both sides): the rule's `for:`,
    Alertmanager's group_wait, a quarter of the window for the rate to cross, then one
    verification window, all within the shift."""
    p, s = params(), GPU_SCENARIOS[name]
    needed = (
        seconds(p["durations"][for_])
        + seconds(p["alertmanager"]["group_wait"])
        + seconds(p["durations"][window]) / 4
        + s.policy["verify_window_s"]
    )
    assert shift_of(s).duration_s >= needed


def test_calibration_args_parse_with_inferd_bench_serve():
    from inferd.engine.bench.serve_options import config_from_args

    for name in NAMES:
        s, calibration = GPU_SCENARIOS[name], CALIBRATIONS[name]
        shift = shift_of(s)
        for config_name, settings in (("default", {}), ("better", calibration.better)):
            argv = calibration_args(name, config_name, model="/m", out="/o/x", duration_s=12)
            args = command_parser("bench").parse_args(["serve", *argv])
            cfg = config_from_args(args)
            assert args.model == "/m" and args.out == "/o/x"
            assert args.server_arg == engine_args_with(s.engine_args, settings)
            assert cfg.rates == list(calibration.rates) and cfg.duration_s == 12 and cfg.max_tokens == shift.max_tokens
            assert cfg.dataset == "uniform"
            low, high = cfg.prompt_len_min * TOKENS_PER_WORD, cfg.prompt_len_max * TOKENS_PER_WORD
            assert low == pytest.approx(shift.prompt_len[0], rel=0.01)
            assert high == pytest.approx(shift.prompt_len[1], rel=0.01)
            (slo,) = cfg.classes
            assert (slo.ttft_s, slo.tpot_s) == (s.ttft_s, s.tpot_s)
        assert list(calibration.rates) == sorted(calibration.rates)
    with pytest.raises(ValueError, match="config"):
        calibration_args(NAMES[0], "best", model="/m", out="/o")


def test_capacity_interpolates_between_the_last_met_and_the_first_missed_level():
    assert capacity([(2, 1.0), (4, 0.5)], 0.9) == pytest.approx(2.4)
    assert capacity([(4, 0.5), (2, 1.0)], 0.9) == pytest.approx(2.4)  # any order
    assert capacity([(2, 1.0), (4, 0.95)], 0.9) == math.inf
    assert capacity([(2, 0.5), (4, 0.95)], 0.9) is None  # the first level already misses
    assert capacity([(2, 1.0), (4, None)], 0.9) == pytest.approx(2.2)  # nothing finished: a miss
    assert capacity([], 0.9) is None


def test_the_shift_rate_goes_between_the_two_capacities():
    default = [(2.0, 1.0), (4.0, 0.5), (6.0, 0.1)]  # capacity 2.4
    better = [(2.0, 1.0), (4.0, 1.0), (6.0, 0.5)]  # capacity 4.4
    rate, why = choose_shift_rate(default, better, 0.9, fallback=9.0)
    assert rate == pytest.approx(2.4 + 0.4 * 2.0) and "of the way" in why
    # the better value holds every level: up to the highest level tried
    rate, _ = choose_shift_rate(default, [(r, 1.0) for r, _ in better], 0.9, fallback=9.0)
    assert rate == pytest.approx(2.4 + 0.4 * (6.0 - 2.4))
    # close capacities: still 10 % over the default's, never past the better's
    rate, _ = choose_shift_rate([(2, 1.0), (4, 0.5)], [(2, 1.0), (4, 0.82)], 0.9, fallback=9.0)
    assert 2.4 < rate <= capacity([(2, 1.0), (4, 0.82)], 0.9)


def test_the_shift_rate_where_the_levels_do_not_separate():
    held = [(2.0, 1.0), (4.0, 1.0)]
    assert choose_shift_rate(held, held, 0.9, 9.0)[0] == 4.0  # no separation: the highest level
    missed = [(2.0, 0.2), (4.0, 0.1)]
    assert choose_shift_rate(missed, missed, 0.9, 9.0)[0] == 9.0  # nothing held: the fallback
    assert choose_shift_rate(missed, held, 0.9, 9.0)[0] == 2.0  # only the better value holds
    worse = choose_shift_rate([(2, 1.0), (4, 0.5)], [(2, 0.5), (4, 0.1)], 0.9, 9.0)
    assert worse[0] == pytest.approx(2.88) and "does not hold more" in worse[1]
    assert choose_shift_rate([], [], 0.9, 9.0)[0] == 9.0


def test_the_script_s_entry_points(tmp_path, capsys):
    assert main(["info", "gpu_kv_thrash"]) == 0
    duration, knob, rate = capsys.readouterr().out.split()
    assert float(duration) == GPU_SCENARIOS["gpu_kv_thrash"].duration_s and knob == "max_num_seqs=8"
    assert float(rate) == shift_of(GPU_SCENARIOS["gpu_kv_thrash"]).rate
    assert main(["bench-args", "gpu_ttft_long_prompts", "better", "--model", "/m", "--out", "/o/b"]) == 0
    assert "--server-arg=--max-num-batched-tokens=2048" in capsys.readouterr().out
    level = {"offered_rate": 0, "attainment": 0}
    (tmp_path / "d.json").write_text(
        json.dumps(
            {
                "levels": [
                    {**level, "offered_rate": 2, "attainment": 1.0},
                    {**level, "offered_rate": 4, "attainment": 0.5},
                ]
            }
        )
    )
    (tmp_path / "b.json").write_text(
        json.dumps(
            {
                "levels": [
                    {**level, "offered_rate": 2, "attainment": 1.0},
                    {**level, "offered_rate": 4, "attainment": 1.0},
                ]
            }
        )
    )
    assert main(["choose", "gpu_kv_thrash", str(tmp_path / "d.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr()
    assert float(out.out) == pytest.approx(2.4 + 0.4 * 1.6, abs=0.01) and "shift rate" in out.err
    # a missing report: the scenario's own rate
    assert main(["choose", "gpu_kv_thrash", str(tmp_path / "none.json"), str(tmp_path / "b.json")]) == 0
    assert float(capsys.readouterr().out) > 0


# ---- --shift-rate --------------------------------------------------------------------------


def test_with_shift_rate_replaces_the_shift_s_rate_only():
    s = GPU_SCENARIOS["gpu_kv_thrash"]
    moved = with_shift_rate(s, 7.5)
    assert [p.rate for p in moved.phases] == [s.phases[0].rate, 7.5, s.phases[2].rate]
    assert [(p.name, p.duration_s, p.prompt_len, p.max_tokens) for p in moved.phases] == [
        (p.name, p.duration_s, p.prompt_len, p.max_tokens) for p in s.phases
    ]
    assert moved.name == s.name and moved.engine_args == s.engine_args and moved.policy == s.policy
    assert with_shift_rate(s, None) is s
    # the run's JSON records it in its phases, and the trace carries it
    assert [p["rate"] for p in phases_out(moved.scaled_phases(0.5))] == [2.0, 7.5, 2.0]
    shift_requests = sum(p.phase == "shift" for p in plan(moved.scaled_phases(0.5), seed=0))
    assert shift_requests == round(7.5 * shift_of(s).duration_s * 0.5)
    assert SCENARIOS["kv_thrash"].phases[1].rate == 16.0  # the registry is untouched
    with_shift_rate(SCENARIOS["kv_thrash"], 3.0)
    assert SCENARIOS["kv_thrash"].phases[1].rate == 16.0


def test_with_shift_rate_refuses_a_scenario_without_a_shift_and_a_bad_rate():
    with pytest.raises(ValueError, match="no shift phase"):
        with_shift_rate(SCENARIOS["control"], 3.0)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="positive"):
            with_shift_rate(GPU_SCENARIOS["gpu_kv_thrash"], bad)


def scenario_args(*argv: str) -> argparse.Namespace:
    return command_parser("bench").parse_args(["scenario", *argv])


class Ran(Exception):
    pass


def test_the_command_runs_the_scenario_with_the_shift_rate(tmp_path, monkeypatch):
    seen = []

    def fake_run_scenario(scenario, way, settings, **kwargs):
        seen.append((scenario, way))
        raise Ran

    monkeypatch.setattr(scenario_run, "run_scenario", fake_run_scenario)
    args = scenario_args("gpu_kv_thrash", "--way", "default", "--shift-rate", "3.25", "--out", str(tmp_path / "x.json"))
    with pytest.raises(Ran):
        scenario_run.run(args)
    (scenario, way), *_ = seen
    assert way == "default" and shift_of(scenario).rate == 3.25


def test_the_command_refuses_a_shift_rate_for_a_scenario_without_a_shift(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(scenario_run, "run_scenario", lambda *a, **k: pytest.fail("ran"))
    monkeypatch.setattr(ways, "run_ways", lambda *a, **k: pytest.fail("ran"))
    out = str(tmp_path / "x.json")
    assert scenario_run.run(scenario_args("control", "--way", "default", "--shift-rate", "3", "--out", out)) == 2
    assert "no shift phase" in capsys.readouterr().err
    assert scenario_run.run(scenario_args("gpu_kv_thrash", "--shift-rate", "0", "--out", out)) == 2
    # --ways all: every scenario named is checked before any runs
    args = scenario_args("gpu_kv_thrash", "control", "--ways", "all", "--shift-rate", "3", "--out", str(tmp_path))
    assert scenario_run.run(args) == 2
    assert "no shift phase" in capsys.readouterr().err


def test_ways_all_passes_the_shift_rate_and_resume_tells_rates_apart(tmp_path, monkeypatch):
    seen = []

    def fake_run_ways(scenario, out_dir, **kwargs):
        seen.append(scenario)
        raise Ran

    monkeypatch.setattr(ways, "run_ways", fake_run_ways)
    args = scenario_args("gpu_ttft_long_prompts", "--ways", "all", "--shift-rate", "6", "--out", str(tmp_path))
    with pytest.raises(Ran):
        scenario_run.run(args)
    assert shift_of(seen[0]).rate == 6.0
    s = GPU_SCENARIOS["gpu_ttft_long_prompts"]
    recorded = {
        "scenario": s.name,
        "way": "default",
        "settings": {},
        "seed": 0,
        "time_scale": 0.5,
        "phases": phases_out(with_shift_rate(s, 6.0).scaled_phases(0.5)),
    }
    assert ways._matches(recorded, with_shift_rate(s, 6.0), "default", {}, 0, 0.5)
    assert not ways._matches(recorded, s, "default", {}, 0, 0.5)


def test_scenario_alert_overrides_name_real_parameters_and_gpu_rules_get_gpu_metrics():
    params = yaml.safe_load((ROOT / "alerts" / "params.yml").read_text())
    for scenario in SCENARIOS.values():
        for key in scenario.alert_params:
            section, _, name = key.partition(".")
            assert name in params[section], f"{scenario.name}: {key} is not in alerts/params.yml"
    underused = GPU_SCENARIOS["gpu_underused"]
    assert underused.gpu_metrics and "sm_active" in underused.watch  # its rule reads DCGM_FI_PROF_SM_ACTIVE
    # the shortened rule can act and be judged within the shift
    shift = shift_of(underused).duration_s
    window, for_ = (seconds(underused.alert_params[f"durations.underutilized_{k}"]) for k in ("window", "for"))
    assert for_ + window / 2 + underused.policy["verify_window_s"] < shift
