"""`inferd bench scenario NAME... --ways all --out DIR`: each scenario three ways.

For each scenario, with one seed and so one trace: the default configuration (agent in
dry run), every point of its declared sweep (`Scenario.sweep`, the product of each
knob's values) as a static configuration, then the agent acting. A sweep point equal to
the default configuration (its knob values are the default's engine arguments) is the
default's own run, not run twice. The best static point is the one of highest
attainment, ties by goodput (agent/scenario/summary_table.py).

A scenario without a sweep (no knob the agent may touch matters, e.g. the engine killed)
has the default as its best static configuration.

DIR gets one JSON per run (`<scenario>-default.json`, `<scenario>-static-<knob>=<v>.json`,
`<scenario>-agent.json`, as `--way` writes them), a timeline PNG per way
(`<scenario>-<way>.png`) and one with the three ways side by side (`<scenario>.png`),
`ways.json` (every scenario's rows, sweep and target checks) and `summary.md` (the
table). The stacks' configs and logs go under DIR/run/. `--resume` reuses a run's JSON
already in DIR when its scenario, way, settings, seed and time scale match.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from inferd.engine.config import EngineConfig

from .scenarios import SCENARIOS, Scenario
from .stack import make_preset_model
from .summary_table import Point, markdown, scenario_summary

log = logging.getLogger(__name__)


def sweep_points(scenario: Scenario) -> list[dict[str, Any]]:
    """Every combination of the sweep's knob values, in the order declared."""
    knobs = list(scenario.sweep)
    return [dict(zip(knobs, values)) for values in itertools.product(*(scenario.sweep[k] for k in knobs))]


def default_values(scenario: Scenario) -> dict[str, Any]:
    """The sweep's knobs as the default configuration sets them: `--knob=value` among its
    engine arguments, else the engine's own default (EngineConfig's)."""
    engine_defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    flags = {f"--{knob.replace('_', '-')}": knob for knob in scenario.sweep}
    out = {knob: engine_defaults[knob] for knob in scenario.sweep if knob in engine_defaults}
    for arg in scenario.engine_args:
        flag, sep, value = arg.partition("=")
        if sep and flag in flags:
            out[flags[flag]] = yaml.safe_load(value)
    return out


def run_name(scenario: str, way: str, settings: Mapping[str, Any] | None = None) -> str:
    if way != "static":
        return f"{scenario}-{way}"
    return f"{scenario}-static-" + "-".join(f"{k}={v}" for k, v in (settings or {}).items())


def _matches(
    run: Mapping[str, Any], scenario: Scenario, way: str, settings: Mapping[str, Any], seed: int, scale: float
) -> bool:
    return (
        run.get("scenario") == scenario.name
        and run.get("way") == way
        and run.get("settings") == dict(settings)
        and run.get("seed") == seed
        and math.isclose(run.get("time_scale", -1.0), scale)
        and [p.get("rate") for p in run.get("phases") or []] == [p.rate for p in scenario.phases]  # --shift-rate
    )


def with_shift_rate(scenario: Scenario, rate: float | None) -> Scenario:
    """`scenario` with its shift phase offered at `rate` req/s (`--shift-rate`; None:
    unchanged). A ValueError when it has no shift phase or the rate is not a positive number."""
    if rate is None:
        return scenario
    if not 0 < rate < math.inf:
        raise ValueError(f"--shift-rate must be a positive number of requests per second, got {rate!r}")
    if scenario.shift_phase is None:
        raise ValueError(f"scenario {scenario.name!r} has no shift phase: --shift-rate does not apply to it")
    phases = tuple(dataclasses.replace(p, rate=rate) if p.name == scenario.shift_phase else p for p in scenario.phases)
    return dataclasses.replace(scenario, phases=phases)


def run_ways(
    scenario: Scenario,
    out_dir: Path,
    *,
    time_scale: float,
    model: Path | None = None,
    interval_s: float | None = None,
    seed: int | None = None,
    resume: bool = False,
    plot: bool = True,
    shift_rate: float | None = None,
) -> dict[str, Any]:
    """Run `scenario` three ways (default, the sweep, agent) into `out_dir`; its summary.
    `shift_rate`: its shift phase's offered load instead of the scenario's (req/s)."""
    from .run import run_scenario  # run.py imports this module for `--ways all`

    scenario = with_shift_rate(scenario, shift_rate)
    seed = scenario.seed if seed is None else seed
    out_dir.mkdir(parents=True, exist_ok=True)
    model = model or make_preset_model(out_dir / "run" / scenario.model_preset, scenario.model_preset)

    def one(way: str, settings: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        name = run_name(scenario.name, way, settings)
        path = out_dir / f"{name}.json"
        if resume and path.exists():
            run = json.loads(path.read_text())
            if _matches(run, scenario, way, settings, seed, time_scale):
                log.info("%s: reusing %s", name, path)
                return run, path.name
        log.info("%s: running (%g s of workload at time scale %g)", name, scenario.duration_s * time_scale, time_scale)
        run = run_scenario(
            scenario,
            way,
            dict(settings),
            time_scale=time_scale,
            run_dir=out_dir / "run" / name,
            model=model,
            interval_s=interval_s,
            seed=seed,
        )
        path.write_text(json.dumps(run, indent=1) + "\n")
        print(f"  {name}: {headline(run)}", flush=True)
        return run, path.name

    default_run, default_file = one("default", {})
    default = Point(default_run, {}, default_file)
    defaults = default_values(scenario)
    sweep = []
    for settings in sweep_points(scenario):
        if settings == {k: defaults.get(k) for k in settings}:
            sweep.append(Point(default_run, settings, default_file, is_default=True))
        else:
            run, file = one("static", settings)
            sweep.append(Point(run, settings, file))
    agent_run, agent_file = one("agent", {})
    agent = Point(agent_run, {}, agent_file)
    summary = scenario_summary(default, sweep, agent, is_control=scenario.shift_phase is None)
    if plot:
        write_timelines(out_dir, summary, {"default": default, "agent": agent, "best_static": _best(sweep, summary)})
    return summary


def _best(sweep: list[Point], summary: Mapping[str, Any]) -> Point:
    chosen = summary["ways"]["best_static"]
    return next(p for p in sweep if p.file == chosen["file"] and dict(p.settings) == chosen["settings"])


def write_timelines(out_dir: Path, summary: Mapping[str, Any], points: Mapping[str, Point]) -> list[Path]:
    """A PNG per way and one of the three side by side; none (and a warning) without matplotlib."""
    try:
        from .timeline_plot import plot
    except ImportError as exc:  # pragma: no cover - matplotlib is in the venv
        log.warning("no timelines: %s", exc)
        return []
    name = summary["scenario"]
    titles = {
        "default": "default (agent in dry run)",
        "best_static": "best static: " + ", ".join(f"{k}={v}" for k, v in points["best_static"].settings.items()),
        "agent": "agent",
    }
    written = []
    for way in ("default", "best_static", "agent"):
        path = out_dir / f"{name}-{way}.png"
        plot([points[way].run], path, [titles[way]])
        written.append(path)
    path = out_dir / f"{name}.png"
    plot([points[way].run for way in ("default", "best_static", "agent")], path, list(titles.values()))
    return written + [path]


def headline(run: Mapping[str, Any]) -> str:
    s = run["summary"]

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.3g}"

    return (
        f"attainment {f(s['attainment'])}, goodput {f(s['goodput_rps'])} req/s, {s['actions']} actions, "
        f"{s['lost']} lost, alerts {', '.join(s['alerts_fired']) or 'none'}, recovery {f(s['recovery_s'])} s"
    )


def run(args: argparse.Namespace) -> int:
    """The `--ways all` command: every scenario named, three ways, into `--out` (a folder)."""
    out_dir: Path = args.out
    summaries = []
    shift_rate = getattr(args, "shift_rate", None)
    scenarios = [with_shift_rate(SCENARIOS[name], shift_rate) for name in args.scenario]  # every one checked first
    for scenario in scenarios:
        name = scenario.name
        print(f"{name}: default, {len(sweep_points(scenario))} sweep points, agent -> {out_dir}", flush=True)
        summaries.append(
            run_ways(
                scenario,
                out_dir,
                time_scale=args.time_scale,
                model=args.model,
                interval_s=args.interval_s,
                seed=args.seed,
                resume=args.resume,
                plot=not args.no_plot,
            )
        )
    write_summary(out_dir, summaries)
    text = markdown(summaries)
    print(text)
    return 0 if all(s["passed"] for s in summaries) or not args.check else 1


def write_summary(out_dir: Path, summaries: list[dict[str, Any]]) -> None:
    from .run import commit, machine

    combined = {"scenarios": summaries, "machine": machine(), "commit": commit()}
    (out_dir / "ways.json").write_text(json.dumps(combined, indent=1) + "\n")
    (out_dir / "summary.md").write_text(markdown(summaries))
