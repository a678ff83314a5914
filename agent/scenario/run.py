"""`inferd bench scenario NAME --way default|agent|static`: one scenario, one way, as JSON.

Starts the real stack (agent/scenario/stack.py: Prometheus and Alertmanager with the
repository's rules at `--time-scale`, the agent running the engine), sends the
scenario's workload (same seed, same trace whichever the way) while a recorder writes
the timeline, stops the stack and writes one JSON file:

    scenario, way, engine_args, settings, time_scale, interval_s, seed, slo
    phases    each phase as run (durations scaled) and its start
    records   the timeline (agent/scenario/recorder.py)
    requests  per request: t, phase, prompt_len, output_tokens, status, ttft, tpot, e2e,
              met, error
    summary   attainment (requests meeting the SLO over all sent), goodput_rps (those per
              second of the workload), requests, lost (not completed and not 429),
              actions (changes applied), alerts_fired (names seen firing), recovery_s
              (from the shift phase's start until the attainment of every later interval
              is >= the target), worst_window_attainment_after_first_action (the
              lowest attainment over any 1-minute window, scaled, after the first
              change), and counts beside them
    machine, commit

Ways: `default` is the scenario's engine arguments with the agent in --dry-run (the same
stack, every decision recorded, nothing acted on); `static` is the same with `--set
KNOB=VALUE` options (one point of a best-static sweep); `agent` acts. Every duration
measured is wall time at the run's time scale; nothing here converts it to production.
A timeline PNG is written beside the JSON (agent/scenario/timeline_plot.py).

`--ways all` runs each scenario named every way into the folder `--out`: the default,
its whole sweep, the agent, then the summary table and the target checks
(agent/scenario/ways.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from .recorder import Endpoints, Recorder, wall_clock
from .scenarios import SCENARIOS, Fault, Scenario, engine_args_with
from .stack import ROOT, SERVED_MODEL, Stack, make_preset_model
from .workload import Attainment, Phase, Sent, Workload, client, phase_starts, plan, request_timeout

log = logging.getLogger(__name__)

WAYS = ("default", "agent", "static")
PRODUCTION_INTERVAL_S = 10.0  # one record every 10 s at production intervals
WINDOW_S = 60.0  # the window of worst_window_attainment_after_first_action, production


def parse_scale(text: str) -> float:
    """`1/30` or `0.0333`."""
    num, sep, den = text.partition("/")
    try:
        value = float(num) / float(den) if sep else float(num)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"expected a number or a fraction such as 1/30, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"time scale must be > 0, got {text!r}")
    return value


def parse_setting(text: str) -> tuple[str, Any]:
    knob, sep, value = text.partition("=")
    if not sep or not knob:
        raise argparse.ArgumentTypeError(f"expected KNOB=VALUE, got {text!r}")
    return knob.strip(), yaml.safe_load(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "scenario",
        nargs="+",
        choices=sorted(SCENARIOS),
        help="the scenario (agent/scenario/scenarios.py); several with --ways all",
    )
    parser.add_argument(
        "--way",
        choices=WAYS,
        help="default: the default configuration, agent in dry run; static: the default with --set; "
        "agent: acting (the default)",
    )
    parser.add_argument(
        "--ways",
        choices=("all",),
        help="all: the default, every point of the scenario's sweep and the agent, same seed; --out is a folder "
        "that gets each run's JSON, timelines, ways.json and summary.md",
    )
    parser.add_argument("--resume", action="store_true", help="with --ways all: reuse matching run JSONs in --out")
    parser.add_argument(
        "--check", action="store_true", help="with --ways all: exit 1 when a scenario misses one of its targets"
    )
    parser.add_argument("--no-plot", action="store_true", help="write no timeline PNG")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        type=parse_setting,
        default=[],
        metavar="KNOB=VALUE",
        help="with --way static: an engine tunable for the whole run, e.g. max_num_seqs=8 (repeatable)",
    )
    parser.add_argument(
        "--time-scale",
        type=parse_scale,
        default=1.0,
        help="multiply every duration (phases, alert rules, policy, recording interval) by this, e.g. 1/30",
    )
    parser.add_argument("--interval-s", type=float, help="seconds between records (default: 10 x the time scale)")
    parser.add_argument("--seed", type=int, help="the workload's seed (default: the scenario's)")
    parser.add_argument(
        "--shift-rate",
        type=float,
        metavar="R",
        help="offer the scenario's shift phase at R req/s instead of its own rate (recorded in the JSON's phases)",
    )
    parser.add_argument("--model", type=Path, help="the engine's checkpoint (default: a tiny one under --run-dir)")
    parser.add_argument(
        "--run-dir", type=Path, help="configs, logs and data of the stack (default: a folder beside --out)"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="the JSON file to write (with --ways all: the folder to write into)"
    )


def run(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request and per collector call is noise
    try:
        if args.ways == "all":
            if args.way or args.settings:
                raise ValueError("--ways all runs every way: no --way or --set with it")
            from . import ways

            return ways.run(args)
        if len(args.scenario) != 1:
            raise ValueError("one scenario per run, or several with --ways all")
        way = args.way or "agent"
        settings = check_way(way, dict(args.settings))
        from .ways import with_shift_rate

        scenario = with_shift_rate(SCENARIOS[args.scenario[0]], args.shift_rate)
    except ValueError as exc:
        print(f"inferd bench scenario: {exc}", file=sys.stderr)
        return 2
    run_dir = args.run_dir or args.out.with_suffix("").with_name(args.out.stem + "-run")
    result = run_scenario(
        scenario,
        way,
        settings,
        time_scale=args.time_scale,
        run_dir=run_dir,
        model=args.model,
        interval_s=args.interval_s,
        seed=args.seed,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if not args.no_plot:
        from .timeline_plot import plot

        plot([result], args.out.with_suffix(".png"), [way])
    s = result["summary"]
    print(
        f"{scenario.name} {way}: attainment {_fmt(s['attainment'])}, goodput {_fmt(s['goodput_rps'])} req/s, "
        f"{s['requests']} requests, {s['lost']} lost, {s['actions']} actions, alerts {s['alerts_fired'] or 'none'}, "
        f"recovery {_fmt(s['recovery_s'])} s -> {args.out}"
    )
    return 0


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def check_way(way: str, settings: dict[str, Any]) -> dict[str, Any]:
    if way not in WAYS:
        raise ValueError(f"way must be one of {', '.join(WAYS)}, got {way!r}")
    if way == "static" and not settings:
        raise ValueError("--way static needs at least one --set KNOB=VALUE")
    if way != "static" and settings:
        raise ValueError(f"--set is for --way static (the {way} way runs the scenario's own configuration)")
    return settings


def run_scenario(
    scenario: Scenario,
    way: str,
    settings: dict[str, Any] | None = None,
    *,
    time_scale: float,
    run_dir: Path,
    model: Path | None = None,
    interval_s: float | None = None,
    seed: int | None = None,
    stack_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run `scenario` one way on a fresh stack under `run_dir`; the result as a dict.
    `stack_options`: more Stack arguments (tests break a rule with them)."""
    settings = check_way(way, dict(settings or {}))
    engine_args = engine_args_with(scenario.engine_args, settings)
    interval_s = interval_s or PRODUCTION_INTERVAL_S * time_scale
    seed = scenario.seed if seed is None else seed
    phases = scenario.scaled_phases(time_scale)
    run_dir.mkdir(parents=True, exist_ok=True)
    model = model or make_preset_model(run_dir / scenario.model_preset, scenario.model_preset)
    shutil.rmtree(run_dir / "stack", ignore_errors=True)  # an old audit log would be replayed by the agent
    options = dict(stack_options or {})
    # The TTFT alert watches the scenario's own TTFT target, as an operator would set it
    # (alerts/params.yml's 2 s is a default, not every SLO).
    options["alert_params"] = {
        "thresholds.ttft_p99_slo_seconds": scenario.ttft_s,
        **scenario.alert_params,
        **options.get("alert_params", {}),
    }
    options.setdefault("gpu_metrics", scenario.gpu_metrics)
    stack = Stack(
        run_dir / "stack",
        time_scale=time_scale,
        engine_args=engine_args,
        policy=scenario.scaled_policy(time_scale),
        acting=way == "agent",
        supervision=scenario.default_supervision if way == "default" else "agent",
        **options,
    )
    try:
        stack.start(model)
        warm_up(stack)
        sent, records, injected = asyncio.run(drive(stack, scenario, phases, seed, interval_s))
        restarts = stack.engine_restarts()
    finally:
        stack.stop()
    return {
        "scenario": scenario.name,
        "way": way,
        "engine_args": engine_args,
        "settings": settings,
        "time_scale": time_scale,
        "interval_s": interval_s,
        "seed": seed,
        "slo": {"ttft_s": scenario.ttft_s, "tpot_s": scenario.tpot_s, "attainment_target": scenario.attainment_target},
        "policy": stack.policy,
        "alert_params": stack.alert_params,
        "phases": phases_out(phases),
        "records": records,
        "requests": [s.summary(scenario.slo) for s in sent],
        "summary": {**summarize(scenario, phases, sent, records, time_scale), "engine_restarts": restarts},
        "faults": injected,
        "supervision": stack.supervision,
        "machine": machine(),
        "commit": commit(),
    }


def warm_up(stack: Stack, requests: int = 2) -> None:
    """A few requests before the clock starts, so the first of the trace pays no first-call cost."""
    for _ in range(requests):
        body = {"model": SERVED_MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 4, "ignore_eos": True, "temperature": 0}
        stack.http.post(f"{stack.url('engine')}/v1/completions", json=body, timeout=120).raise_for_status()


async def drive(
    stack: Stack, scenario: Scenario, phases: Sequence[Phase], seed: int, interval_s: float
) -> tuple[list[Sent], list[dict[str, Any]], list[dict[str, Any]]]:
    endpoints = Endpoints(stack.url("engine"), stack.url("prometheus"), stack.url("agent"), stack.admin_token)
    workload = Workload(stack.url("engine"), plan(phases, seed), model=SERVED_MODEL, timeout_s=request_timeout(phases))
    started, unix_start = wall_clock()
    recorder = Recorder(
        endpoints, workload, phases, scenario.slo, interval_s, unix_start=unix_start, watch=scenario.watch
    )
    workload.started = started
    stop = asyncio.Event()
    injected: list[dict[str, Any]] = []
    async with client() as requests, httpx.AsyncClient(timeout=10) as collectors:
        recording = asyncio.create_task(recorder.run(collectors, stop))
        faults = asyncio.create_task(inject_faults(stack, collectors, scenario.faults, phases, started, injected))
        try:
            sent = await workload.run(requests, started)
        finally:
            stop.set()
            records = await recording
            faults.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await faults  # a fault that failed to go in raises here
    return sent, records, injected


async def inject_faults(
    stack: Stack,
    http: httpx.AsyncClient,
    faults: Sequence[Fault],
    phases: Sequence[Phase],
    started: float,
    injected: list[dict[str, Any]],
) -> None:
    """Each fault as its phase starts, appended to `injected` (the recorder sees its effect)."""
    starts = phase_starts(phases)
    for fault in sorted(faults, key=lambda f: starts[f.phase]):
        await asyncio.sleep(max(0.0, starts[fault.phase] - (time.monotonic() - started)))
        result = await inject(stack, http, fault)
        injected.append({"kind": fault.kind, "phase": fault.phase, "t": round(time.monotonic() - started, 3), **result})
        log.info("injected %s fault at %s: %s", fault.kind, fault.phase, result)


async def inject(stack: Stack, http: httpx.AsyncClient, fault: Fault) -> dict[str, Any]:
    """fastpath, slow_swap: the engine's own fault injection. kill: SIGKILL to the engine's process
    group (the API server and its engine core), as the OOM killer or a crash would. hang:
    SIGSTOP to the same group: the process lives, holds its port and answers nothing."""
    if fault.kind in ("fastpath", "slow_swap"):
        body: dict[str, Any] = {"kind": fault.kind}
        if fault.kind == "slow_swap":
            body["seconds_per_block"] = fault.seconds_per_block
        response = await http.post(f"{stack.url('engine')}/admin/fault", json=body, headers=stack.admin_headers)
        return {"status": response.status_code}
    pid = await asyncio.to_thread(stack.engine_pid)
    if pid is None:
        return {"error": "no engine process"}
    os.killpg(pid, signal.SIGKILL if fault.kind == "kill" else signal.SIGSTOP)
    return {"pid": pid}


def phases_out(phases: Sequence[Phase]) -> list[dict[str, Any]]:
    starts = phase_starts(phases)
    return [
        {
            "name": p.name,
            "start_s": starts[p.name],
            "duration_s": p.duration_s,
            "rate": p.rate,
            "prompt_len": list(p.prompt_len),
            "max_tokens": p.max_tokens,
            "slo_class": p.slo_class,
        }
        for p in phases
    ]


# ---- the summary -----------------------------------------------------------------------


def audit_events(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for r in records for a in (r.get("actions") or [])]


def is_ok(record: dict[str, Any], target: float) -> bool:
    """The interval met the target. One where nothing finished says nothing: a request
    still in flight counts in the interval it finishes in (a hung one when it times out)."""
    attainment = record.get("attainment")
    return attainment is None or attainment >= target


def recovery_s(records: Sequence[dict[str, Any]], since: float, target: float) -> float | None:
    """Seconds from `since` until every later interval meets `target`: 0 when none after
    it missed, None when the last one missed (not back by the end of the run)."""
    after = [r for r in records if r["t"] > since]
    bad = [i for i, r in enumerate(after) if not is_ok(r, target)]
    if not bad:
        return 0.0
    if bad[-1] == len(after) - 1:
        return None
    return round(after[bad[-1]]["t"] - since, 3)


def worst_window(records: Sequence[dict[str, Any]], since: float, window_s: float) -> float | None:
    """The lowest attainment of the requests finished in any `window_s` run of intervals
    starting at or after `since` (a shorter tail counts when no full window fits)."""
    after = [r for r in records if r["t"] - r["interval_s"] >= since - 1e-9]
    if not after:
        return None
    worst: float | None = None
    for i, first in enumerate(after):
        start = first["t"] - first["interval_s"]
        span = [r for r in after[i:] if r["t"] <= start + window_s + 1e-9]
        if i and span[-1] is after[-1] and after[-1]["t"] - start < window_s - 1e-9:
            break  # only partial windows left
        finished = sum(r["finished"] for r in span)
        if finished:
            value = sum(r["met"] for r in span) / finished
            worst = value if worst is None else min(worst, value)
    return worst


def summarize(
    scenario: Scenario,
    phases: Sequence[Phase],
    sent: Sequence[Sent],
    records: Sequence[dict[str, Any]],
    time_scale: float,
) -> dict[str, Any]:
    a = Attainment.of(sent, scenario.slo)
    duration = sum(p.duration_s for p in phases)
    events = audit_events(records)
    applied = [e for e in events if e.get("event") == "applied"]
    fired = sorted({al["name"] for r in records for al in (r.get("alerts") or []) if al["state"] == "firing"})
    shift = phase_starts(phases).get(scenario.shift_phase) if scenario.shift_phase else None
    first_action = min((e["t"] for e in applied), default=None)
    return {
        "attainment": a.attainment,
        "ttft_attainment": a.share(a.ttft_met),
        "tpot_attainment": a.share(a.tpot_met),
        "goodput_rps": a.met / duration if duration > 0 else None,
        "requests": len(sent),
        "completed": a.completed,
        "lost": a.lost,
        "shed": a.shed,
        "actions": len(applied),
        "dry_run_decisions": sum(e.get("event") == "decision" and e.get("result") == "dry_run" for e in events),
        "audit_events": dict(sorted(Counter(e.get("event") for e in events).items())),
        "alerts_fired": fired,
        "first_action_s": first_action,
        "recovery_s": recovery_s(records, shift, scenario.attainment_target) if shift is not None else None,
        "worst_window_attainment_after_first_action": (
            worst_window(records, first_action, WINDOW_S * time_scale) if first_action is not None else None
        ),
        "collector_errors": sum(len(r.get("errors") or {}) for r in records),
        "records": len(records),
    }


def machine() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": model or platform.processor(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
