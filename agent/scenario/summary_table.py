"""A scenario three ways, judged: the rows of the summary table and the targets.

Input is what `inferd bench scenario` writes per run (agent/scenario/run.py): the default
configuration (agent in dry run), each point of the best-static sweep, and the agent
acting, all with the same seed and trace. Output is plain data (a dict per scenario, as
`ways.json` holds it) and its Markdown.

The best static point has the highest attainment, ties broken by goodput (then the
default configuration's point, then the first swept). The targets
(the closed-loop issue's), each with its value, threshold and margin:

- with a fault (a scenario with a shift phase):
  - `vs_default`: where the default misses its attainment target, the agent's
    attainment >= the default's + 20 points (not applicable where the default meets it);
  - `vs_best_static`: the agent's attainment >= the best static's - 5 points;
  - `window_vs_default`: in every 1-minute window (scaled) after the agent's first
    action, its attainment >= the default's in the same window - 2 points (windows are
    runs of the recorder's intervals, the same intervals in both runs; not applicable
    when the agent never acted);
  - `lost`: 0 requests lost (non-2xx other than 429, transport or stream errors);
  - `recovery`: attainment back above target within 3 minutes of the shift, measured
    at the run's time scale against 180 s x the scale (never converted to production);
- the control (no shift phase): 0 actions, 0 alerts fired, 0 lost, with the agent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

WINDOW_S = 60.0  # production seconds; run.py's WINDOW_S
VS_DEFAULT_POINTS = 0.20
VS_BEST_STATIC_POINTS = 0.05
WINDOW_POINTS = 0.02
RECOVERY_S = 180.0  # production seconds
WAYS = ("default", "best_static", "agent")
WAY_TITLES = {"default": "default", "best_static": "best static", "agent": "agent"}


@dataclass(frozen=True, slots=True)
class Check:
    """One target: `passed` None when it does not apply (`note` says why). `margin` is
    value - threshold for a floor, threshold - value for a ceiling: >= 0 passes."""

    name: str
    target: str
    value: float | None
    threshold: float | None
    margin: float | None
    passed: bool | None
    note: str = ""


def _floor(name: str, target: str, value: float | None, threshold: float | None, note: str = "") -> Check:
    if value is None or threshold is None:
        return Check(name, target, value, threshold, None, False, note or "no value")
    margin = value - threshold
    return Check(name, target, value, threshold, margin, margin >= -1e-12, note)


def _ceiling(name: str, target: str, value: float | None, threshold: float, note: str = "") -> Check:
    if value is None:
        return Check(name, target, value, threshold, None, False, note or "no value")
    margin = threshold - value
    return Check(name, target, value, threshold, margin, margin >= -1e-12, note)


def _not_applicable(name: str, target: str, note: str) -> Check:
    return Check(name, target, None, None, None, None, note)


# ---- 1-minute windows -------------------------------------------------------------------


TICK_EARLY = 0.05  # a timer may fire a little early; a busy event loop records late


def _tick(t: float, interval_s: float) -> int:
    return math.floor(t / interval_s + TICK_EARLY)


def _ticks(record: Mapping[str, Any], interval_s: float) -> tuple[int, int]:
    """The recorder's interval ticks a record covers, (first, last]: a record is taken at
    or after its tick (later when the loop is busy), and a slow one skips ticks."""
    return _tick(record["t"] - record["interval_s"], interval_s), _tick(record["t"], interval_s)


def windows(
    records: Sequence[Mapping[str, Any]], since: float, window_s: float, interval_s: float, until: float | None = None
) -> list[tuple[float, int, int]]:
    """(start, finished, met) of each window of `window_s` (a whole number of the
    recorder's intervals) starting at each interval boundary from the first one at or
    after `since`, up to `until` (default: the last record). One short window when no
    full one fits. Records are placed by their interval ticks, so two runs of one trace
    get the same windows."""
    size = max(1, round(window_s / interval_s))
    first = math.ceil(since / interval_s - 1e-9)
    spans = [(*_ticks(r, interval_s), r) for r in records]
    if not spans:
        return []
    last = max(end for _, end, _ in spans) if until is None else math.floor(until / interval_s + 1e-9)
    starts = list(range(first, last - size + 1)) or ([first] if first < last else [])
    out = []
    for a in starts:
        inside = [r for start, end, r in spans if start >= a and end <= a + size]
        out.append((round(a * interval_s, 6), sum(r["finished"] for r in inside), sum(r["met"] for r in inside)))
    return out


def worst_window(
    records: Sequence[Mapping[str, Any]], since: float, window_s: float, interval_s: float, until: float | None = None
) -> tuple[float | None, int]:
    """The lowest attainment over `windows` (None when none finished anything) and the
    number of requests finished in that window."""
    worst: tuple[float | None, int] = (None, 0)
    for _, finished, met in windows(records, since, window_s, interval_s, until):
        if finished and (worst[0] is None or met / finished < worst[0]):
            worst = (met / finished, finished)
    return worst


def worst_window_delta(
    agent: Mapping[str, Any], default: Mapping[str, Any], since: float, window_s: float
) -> tuple[float | None, float | None]:
    """The lowest (agent - default) attainment over the windows after `since` where either
    finished something (a way that finished nothing in a window where the other did counts
    0 there: a dead or hung engine), and that window's start; (None, None) when there is none."""
    interval = agent["interval_s"]
    until = min(agent["records"][-1]["t"], default["records"][-1]["t"])
    ours = windows(agent["records"], since, window_s, interval, until)
    theirs = {
        start: (finished, met) for start, finished, met in windows(default["records"], since, window_s, interval, until)
    }
    worst: tuple[float | None, float | None] = (None, None)
    for start, finished, met in ours:
        other_finished, other_met = theirs.get(start, (0, 0))
        if not finished and not other_finished:
            continue
        delta = (met / finished if finished else 0.0) - (other_met / other_finished if other_finished else 0.0)
        if worst[0] is None or delta < worst[0]:
            worst = (delta, start)
    return worst


# ---- the rows ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Point:
    """A run and what it stands for: a sweep point's settings (the default's run stands
    for the point that is the default configuration: `is_default`), and its file."""

    run: Mapping[str, Any]
    settings: Mapping[str, Any]
    file: str | None = None
    is_default: bool = False

    @property
    def summary(self) -> Mapping[str, Any]:
        return self.run["summary"]


def best_static(points: Sequence[Point]) -> Point:
    """The point with the highest attainment, ties by goodput, then the default
    configuration's point, then the first."""
    if not points:
        raise ValueError("no static point to choose from")

    def key(p: Point) -> tuple[float, float, bool]:
        return (p.summary["attainment"] or 0.0, p.summary["goodput_rps"] or 0.0, p.is_default)

    best = points[0]
    for p in points[1:]:
        if key(p) > key(best):
            best = p
    return best


def row(point: Point, first_action_s: float | None) -> dict[str, Any]:
    """A way's row: its summary's headline numbers, and its worst 1-minute window after
    the agent's first action (the same span of the trace for all three ways)."""
    run, s = point.run, point.summary
    worst, worst_n = (None, 0)
    if first_action_s is not None:
        window = WINDOW_S * run["time_scale"]
        worst, worst_n = worst_window(run["records"], first_action_s, window, run["interval_s"])
    return {
        "file": point.file,
        "settings": dict(point.settings),
        "is_default": point.is_default,
        "attainment": s["attainment"],
        "goodput_rps": s["goodput_rps"],
        "recovery_s": s["recovery_s"],
        "actions": s["actions"],
        "lost": s["lost"],
        "shed": s["shed"],
        "requests": s["requests"],
        "alerts_fired": list(s["alerts_fired"]),
        "first_action_s": s["first_action_s"],
        "worst_window_after_first_action": worst,
        "worst_window_requests": worst_n,
    }


def checks(
    default: Mapping[str, Any], best: Mapping[str, Any], agent: Mapping[str, Any], *, is_control: bool
) -> list[Check]:
    """The targets for one scenario, from the three runs."""
    a = agent["summary"]
    if is_control:
        return [
            _ceiling("actions", "0 actions with the agent", a["actions"], 0),
            _ceiling("alerts", "0 alerts fired", len(a["alerts_fired"]), 0, ", ".join(a["alerts_fired"])),
            _ceiling("lost", "0 requests lost or 5xx", a["lost"], 0),
        ]
    target = default["slo"]["attainment_target"]
    d_att, a_att = default["summary"]["attainment"], a["attainment"]
    out = []
    if d_att is not None and d_att >= target:
        note = f"the default meets its target ({target:.0%})"
        out.append(_not_applicable("vs_default", "agent >= default + 20 points", note))
    else:
        threshold = None if d_att is None else d_att + VS_DEFAULT_POINTS
        out.append(_floor("vs_default", "agent >= default + 20 points", a_att, threshold))
    b_att = best["summary"]["attainment"]
    threshold = None if b_att is None else b_att - VS_BEST_STATIC_POINTS
    out.append(_floor("vs_best_static", "agent within 5 points of the best static", a_att, threshold))
    first = a["first_action_s"]
    window_target = "no 1-minute window 2+ points below the default"
    if first is None:
        out.append(_not_applicable("window_vs_default", window_target, "no action"))
    else:
        delta, start = worst_window_delta(agent, default, first, WINDOW_S * agent["time_scale"])
        note = "" if start is None else f"window from t = {start:g} s"
        out.append(_floor("window_vs_default", window_target, delta, -WINDOW_POINTS, note))
    out.append(_ceiling("lost", "0 requests lost or 5xx", a["lost"], 0))
    limit = RECOVERY_S * agent["time_scale"]
    recovery = a["recovery_s"]
    note = "" if recovery is not None else "not back by the end of the run"
    target_text = f"back above target within 3 minutes ({limit:g} s at the run's scale)"
    out.append(_ceiling("recovery", target_text, recovery, limit, note))
    return out


def scenario_summary(default: Point, sweep: Sequence[Point], agent: Point, *, is_control: bool) -> dict[str, Any]:
    """One scenario three ways: the rows, the sweep, the targets."""
    best = best_static(sweep)
    run = agent.run
    first = agent.summary["first_action_s"]
    found = checks(default.run, best.run, run, is_control=is_control)
    return {
        "scenario": run["scenario"],
        "is_control": is_control,
        "seed": run["seed"],
        "time_scale": run["time_scale"],
        "interval_s": run["interval_s"],
        "attainment_target": run["slo"]["attainment_target"],
        "sweep": [
            {
                "settings": dict(p.settings),
                "is_default": p.is_default,
                "attainment": p.summary["attainment"],
                "goodput_rps": p.summary["goodput_rps"],
                "file": p.file,
            }
            for p in sweep
        ],
        "ways": {"default": row(default, first), "best_static": row(best, first), "agent": row(agent, first)},
        "checks": [asdict(c) for c in found],
        "passed": all(c.passed for c in found if c.passed is not None),
    }


# ---- Markdown ---------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _plain(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _points(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f} pts"


def scale_text(time_scale: float) -> str:
    frac = Fraction(time_scale).limit_denominator(1000)
    if abs(float(frac) - time_scale) < 1e-9 and frac.numerator == 1 and frac.denominator > 1:
        return f"1/{frac.denominator}"
    return f"{time_scale:g}"


def _config(way: str, r: Mapping[str, Any]) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in r["settings"].items())
    if way == "default" or not settings:
        return "default"
    return f"{settings} (the default)" if r.get("is_default") else settings


def _check_value(c: Mapping[str, Any]) -> tuple[str, str, str]:
    """value, threshold, margin as text: attainment checks in % and points, counts as counts."""
    if c["name"] in ("vs_default", "vs_best_static"):
        return _pct(c["value"]), _pct(c["threshold"]), _points(c["margin"])
    if c["name"] == "window_vs_default":
        return _points(c["value"]), _points(c["threshold"]), _points(c["margin"])
    if c["name"] == "recovery":
        return f"{_num(c['value'])} s", f"{_num(c['threshold'])} s", f"{_num(c['margin'])} s"
    return _plain(c["value"]), _plain(c["threshold"]), _plain(c["margin"])


def markdown(summaries: Iterable[Mapping[str, Any]]) -> str:
    """The table (scenario x way) and the targets, as Markdown."""
    summaries = list(summaries)
    lines = [
        "| scenario | way | configuration | attainment | goodput (req/s) | recovery (s) | actions | lost "
        "| worst 1-min window after first action | alerts fired |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in summaries:
        for way in WAYS:
            r = s["ways"][way]
            worst = r["worst_window_after_first_action"]
            worst_text = "-" if worst is None else f"{_pct(worst)} (n={r['worst_window_requests']})"
            lines.append(
                f"| {s['scenario']} | {WAY_TITLES[way]} | {_config(way, r)} | {_pct(r['attainment'])} "
                f"| {_num(r['goodput_rps'])} | {_num(r['recovery_s'])} | {r['actions']} | {r['lost']} | {worst_text} "
                f"| {', '.join(r['alerts_fired']) or '-'} |"
            )
    lines += ["", "| scenario | target | value | threshold | margin | result |", "|---|---|---:|---:|---:|---|"]
    for s in summaries:
        for c in s["checks"]:
            value, threshold, margin = _check_value(c)
            result = "n/a" if c["passed"] is None else ("pass" if c["passed"] else "**FAIL**")
            note = f" ({c['note']})" if c["note"] else ""
            lines.append(f"| {s['scenario']} | {c['target']} | {value} | {threshold} | {margin} | {result}{note} |")
    notes = []
    for s in summaries:
        sweep = s["sweep"]
        points = "; ".join(f"{_config('static', p)} {_pct(p['attainment'])}" for p in sweep)
        notes.append(
            f"- {s['scenario']}: seed {s['seed']}, time scale {scale_text(s['time_scale'])} (every duration, "
            f"recovery included, is wall time at that scale), attainment target {_pct(s['attainment_target'])}; "
            f"best static of {len(sweep)} points swept: {points}"
        )
    return "\n".join(lines + [""] + notes) + "\n"
