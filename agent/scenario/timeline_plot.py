"""The PNG timeline of scenario runs: one column per run (a way), on one time axis.

Rows, top to bottom: the load (offered and served requests/s, KV page faults/s on the
right axis); the SLO attainment per interval and over the trailing 1-minute window
(scaled), with the target; the knobs in force (the engine's numeric tunables that change
in any run, and those a run sets); the alerts pending and firing as spans and the
agent's audit events as markers (applied, restored, rolled back; decisions of a dry run
hollow). Phase starts are dotted lines, the agent's changes red lines through every row.
matplotlib is imported when a plot is made, not with the module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .summary_table import WINDOW_S, scale_text

MAX_KNOBS = 6
EVENT_STYLE = {  # audit event -> (marker, colour, filled, label)
    "applied": ("v", "tab:red", True, "applied"),
    "restored": ("o", "tab:green", True, "restored"),
    "rolled_back": ("X", "tab:purple", True, "rolled back"),
    "failed": ("x", "black", True, "failed"),
    "dry_run": ("v", "tab:gray", False, "decision (dry run)"),
}


def _num(value: Any) -> float:
    return float("nan") if value is None else float(value)


def knob_series(records: Sequence[Mapping[str, Any]], knob: str) -> tuple[list[float], str]:
    """A knob's value per record and its legend label; a knob with named values (mode,
    preemption_mode, kv_cold_dtype) is drawn as each value's index, the label saying which."""
    raw = [(r.get("tunables") or {}).get(knob) for r in records]
    names = sorted({v for v in raw if isinstance(v, str)})
    if not names:
        return [_num(v) for v in raw], knob
    index = {name: float(i) for i, name in enumerate(names)}
    values = [index[v] if isinstance(v, str) else float("nan") for v in raw]
    return values, f"{knob} ({', '.join(f'{i}: {name}' for i, name in enumerate(names))})"


def _steps(records: Sequence[Mapping[str, Any]], values: Sequence[float]) -> tuple[list[float], list[float]]:
    """x and y for `step(where="pre")`: each value holds over its record's interval."""
    if not records:
        return [], []
    xs = [records[0]["t"] - records[0]["interval_s"]] + [r["t"] for r in records]
    return xs, [values[0], *values]


def trailing_attainment(records: Sequence[Mapping[str, Any]], window_s: float) -> list[float]:
    """Per record, the attainment of the requests finished over the `window_s` ending at it."""
    out = []
    for r in records:
        span = [q for q in records if r["t"] - window_s < q["t"] <= r["t"]]
        finished = sum(q["finished"] for q in span)
        out.append(sum(q["met"] for q in span) / finished if finished else float("nan"))
    return out


def trailing_mean(records: Sequence[Mapping[str, Any]], key: str, window_s: float) -> list[float]:
    """Per record, the time-weighted mean of a rate over the `window_s` ending at it."""
    out = []
    for r in records:
        span = [q for q in records if r["t"] - window_s < q["t"] <= r["t"] and q[key] is not None]
        seconds = sum(q["interval_s"] for q in span)
        out.append(sum(q[key] * q["interval_s"] for q in span) / seconds if seconds else float("nan"))
    return out


def knobs(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The numeric tunables worth a line: those a run sets and those that change in a run."""
    chosen = {k for run in runs for k in (run.get("settings") or {})}
    seen: dict[str, set[Any]] = {}
    for run in runs:
        for r in run["records"]:
            for k, v in (r.get("tunables") or {}).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    seen.setdefault(k, set()).add(v)
    chosen |= {k for k, values in seen.items() if len(values) > 1}
    if not chosen and "max_num_seqs" in seen:
        chosen.add("max_num_seqs")
    return sorted(chosen)[:MAX_KNOBS]


def alert_spans(records: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[float, float, str]]]:
    """alert name -> [(start, width, state)], consecutive intervals of one state merged."""
    spans: dict[str, list[tuple[float, float, str]]] = {}
    for r in records:
        start = r["t"] - r["interval_s"]
        for alert in r.get("alerts") or []:
            runs = spans.setdefault(alert["name"], [])
            if runs and runs[-1][2] == alert["state"] and math.isclose(runs[-1][0] + runs[-1][1], start, abs_tol=1e-6):
                s, _, state = runs[-1]
                runs[-1] = (s, r["t"] - s, state)
            else:
                runs.append((start, r["interval_s"], alert["state"]))
    return spans


def events(records: Sequence[Mapping[str, Any]]) -> list[tuple[float, str, str]]:
    """(t, style key, text) for each audit event worth a marker."""
    out = []
    for r in records:
        for a in r.get("actions") or []:
            kind = a.get("event")
            if kind == "decision" and a.get("result") == "dry_run":
                kind = "dry_run"
            if kind in EVENT_STYLE and a.get("t") is not None:
                change = a.get("new") or a.get("restored") or {}
                text = ", ".join(f"{k}={v}" for k, v in change.items()) if isinstance(change, dict) else ""
                out.append((a["t"], kind, text))
    return out


def plot(runs: Sequence[Mapping[str, Any]], path: Path, titles: Sequence[str] | None = None) -> None:
    """One column per run in `runs` (recorded JSONs of agent/scenario/run.py)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not runs:
        raise ValueError("nothing to plot")
    titles = list(titles or [run["way"] for run in runs])
    names = sorted({name for run in runs for name in alert_spans(run["records"])})
    rows = [*names, "agent"]
    knob_names = knobs(runs)
    twins = []
    fig, axes = plt.subplots(
        4,
        len(runs),
        figsize=(1.2 + 5.4 * len(runs), 10.5),
        sharex="col",
        sharey="row",
        squeeze=False,
        gridspec_kw={"height_ratios": [3, 3, 2, 0.6 + 0.45 * len(rows)]},
    )
    for col, (run, title) in enumerate(zip(runs, titles)):
        load, attainment, knob_ax, alerts = axes[:, col]
        records = run["records"]
        scale = run["time_scale"]
        window = WINDOW_S * scale
        for key, colour in (("offered_rps", "tab:blue"), ("served_rps", "tab:orange")):
            xs, ys = _steps(records, [_num(r[key]) for r in records])
            load.step(xs, ys, where="pre", color=colour, linewidth=0.5, alpha=0.35)
            xs, ys = _steps(records, trailing_mean(records, key, window))
            load.step(
                xs, ys, where="pre", color=colour, linewidth=1.6, label=f"{key[:-4]} (trailing 1 min: {window:.3g} s)"
            )
        faults = load.twinx()
        xs, ys = _steps(records, [_num(r.get("kv_page_faults_per_s")) for r in records])
        faults.step(xs, ys, where="pre", color="tab:gray", linewidth=0.8, alpha=0.7, label="KV faults/s")
        twins.append(faults)
        if col < len(runs) - 1:
            faults.tick_params(labelright=False)
        else:
            faults.set_ylabel("KV page faults/s", color="tab:gray")
        load.set_title(title)

        xs, ys = _steps(records, [_num(r["attainment"]) for r in records])
        attainment.step(xs, ys, where="pre", color="tab:blue", linewidth=0.7, alpha=0.6, label="per interval")
        xs, ys = _steps(records, trailing_attainment(records, window))
        attainment.step(xs, ys, where="pre", color="tab:blue", linewidth=1.8, label=f"trailing 1 min ({window:.3g} s)")
        target = run["slo"]["attainment_target"]
        attainment.axhline(target, color="tab:red", linestyle="--", linewidth=1, label=f"target {target:.0%}")
        attainment.set_ylim(-0.03, 1.03)

        for knob in knob_names:
            values, label = knob_series(records, knob)
            xs, ys = _steps(records, values)
            knob_ax.step(xs, ys, where="pre", label=label)

        for i, name in enumerate(rows[:-1]):
            for start, width, state in alert_spans(records).get(name, []):
                firing = state == "firing"
                alerts.broken_barh(
                    [(start, width)],
                    (i - 0.35, 0.7),
                    color="tab:red" if firing else "tab:orange",
                    alpha=0.8 if firing else 0.35,
                )
        seen = set()
        for t, kind, text in events(records):
            marker, colour, filled, label = EVENT_STYLE[kind]
            alerts.plot(
                [t],
                [len(rows) - 1],
                marker=marker,
                markersize=9,
                color=colour,
                markerfacecolor=colour if filled else "none",
                linestyle="none",
                label=None if kind in seen else label,
            )
            seen.add(kind)
            if kind == "applied":
                for ax in (load, attainment, knob_ax, alerts):
                    ax.axvline(t, color="tab:red", linewidth=0.8, alpha=0.5)
                if text:
                    alerts.annotate(text, (t, len(rows) - 1), xytext=(4, 6), textcoords="offset points", fontsize=7)
        alerts.set_yticks(range(len(rows)), rows, fontsize=8)
        alerts.set_ylim(-0.6, len(rows) - 0.4)
        end = records[-1]["t"] if records else 1.0
        for phase in run["phases"]:
            for ax in (load, attainment, knob_ax, alerts):
                ax.axvline(phase["start_s"], color="black", linestyle=":", linewidth=0.8)
            load.annotate(
                phase["name"],
                (phase["start_s"], 1),
                xycoords=("data", "axes fraction"),
                xytext=(3, -12),
                textcoords="offset points",
                fontsize=8,
            )
        alerts.set_xlim(0, end)
        alerts.set_xlabel(f"seconds (time scale {scale_text(scale)})")
        s = run["summary"]
        att = "-" if s["attainment"] is None else f"{s['attainment']:.1%}"
        attainment.set_title(f"attainment {att}, {s['actions']} actions, {s['lost']} lost", fontsize=9)
        if col == 0:
            load.set_ylabel("requests/s")
            attainment.set_ylabel("SLO attainment")
            knob_ax.set_ylabel("knobs in force")
            alerts.set_ylabel("alerts / agent")
            handles, labels = load.get_legend_handles_labels()
            more, more_labels = faults.get_legend_handles_labels()
            load.legend(handles + more, labels + more_labels, fontsize=7, loc="center left", framealpha=0.6)
            for ax in (attainment, knob_ax, alerts):
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize=7, loc="lower left")
        elif alerts.get_legend_handles_labels()[0]:
            alerts.legend(fontsize=7, loc="lower left")
    top = max((ax.get_ylim()[1] for ax in twins), default=1.0)
    for ax in twins:  # one scale for the faults of every way
        ax.set_ylim(0, max(top, 1.0))
    fig.suptitle(f"{runs[0]['scenario']}: seed {runs[0]['seed']}, time scale {scale_text(runs[0]['time_scale'])}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
