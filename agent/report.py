"""`inferd report`: a static HTML page with PNG plots of the boards' headline panels.

For people without Grafana at hand: queries Prometheus for the last N minutes with the
very expressions the boards use (dashboards/spec.py panels marked `headline`), draws
each panel with matplotlib and writes `index.html` beside the PNGs, in `--output` (default
`.out/report` in the repository when run inside the checkout, where git ignores it;
`./inferd-report` elsewhere); it prints the page's absolute path. The page opens with a
diagnosis section: the `inferd doctor` checks over the same window.
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from inferd.agent.doctor.inputs import DoctorOptions
from inferd.agent.doctor.render import to_html
from inferd.agent.doctor.runner import diagnose
from inferd.agent.prometheus import PrometheusClient
from inferd.dashboards.promql import expand, legend
from inferd.dashboards.spec import Board, Panel

COLORS = {
    "green": "#37872d",
    "yellow": "#e0b400",
    "orange": "#fa6400",
    "red": "#c4162a",
    "blue": "#1f60c4",
    "purple": "#8f3bb8",
}


@dataclass(frozen=True, slots=True)
class ReportConfig:
    prometheus_url: str
    minutes: int
    out_dir: Path
    step_s: int

    def __post_init__(self) -> None:
        if not self.prometheus_url.startswith(("http://", "https://")):
            raise ValueError(f"--prometheus must be an http(s) URL, got {self.prometheus_url!r}")
        if not 1 <= self.minutes <= 7 * 24 * 60:
            raise ValueError(f"--minutes must be between 1 and 10080, got {self.minutes}")
        if self.step_s < 1:
            raise ValueError(f"--step must be at least 1 second, got {self.step_s}")


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    times: list[float]
    values: list[float]


def panel_series(
    config: ReportConfig, prometheus: PrometheusClient, panel: Panel, start: float, end: float
) -> list[Series]:
    # Grafana's $__rate_interval is at least four scrape intervals; 4 x step is the same idea here.
    rate_interval = f"{max(4 * config.step_s, 20)}s"
    series = []
    for query in panel.queries:
        expr = expand(
            query.expr, rate_interval=rate_interval, interval=f"{config.step_s}s", range_=f"{config.minutes}m"
        )
        for result in prometheus.query_range(expr, start, end, config.step_s):
            points = [(float(t), float(v)) for t, v in result["values"]]
            series.append(
                Series(legend(query.legend, result["metric"]), [p[0] for p in points], [p[1] for p in points])
            )
    return series


def plot(panel: Panel, series: list[Series], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2), dpi=100)
    for s in series:
        # datetimes go through matplotlib's date converter (date ticks); its stubs take arrays only
        times = [dt.datetime.fromtimestamp(t) for t in s.times]
        ax.plot(times, s.values, label=s.name, linewidth=1.4)  # type: ignore[arg-type]
    for threshold in panel.thresholds[1:]:
        if threshold.value is None:  # only the base step, thresholds[0], has none (Panel checks)
            continue
        ax.axhline(threshold.value, color=COLORS.get(threshold.color, "grey"), linestyle="--", linewidth=0.8)
    ax.set_title(panel.title, fontsize=10)
    ax.set_ylabel(panel.unit.removeprefix("suffix: "), fontsize=8)
    if panel.min is not None:
        ax.set_ylim(bottom=panel.min)
    if panel.max is not None and all(v <= panel.max for s in series for v in s.values):
        ax.set_ylim(top=panel.max * 1.05)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=7)
    if 0 < len(series) <= 12:
        ax.legend(fontsize=7, loc="upper left")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def board_sections(
    config: ReportConfig, prometheus: PrometheusClient, boards: tuple[Board, ...], start: float, end: float
) -> list[str]:
    """One HTML section per board with headline panels: each panel's plot and last values."""
    sections = []
    for board in boards:
        items = []
        for panel in (p for p in board.panels if p.headline):
            series = panel_series(config, prometheus, panel, start, end)
            body = f"<p class='desc'>{html.escape(panel.full_description)}</p>"
            if series:
                image = f"{board.uid}-{slug(panel.title)}.png"
                plot(panel, series, config.out_dir / image)
                latest = "".join(
                    f"<tr><td>{html.escape(s.name)}</td><td>{s.values[-1]:.4g}</td></tr>" for s in series if s.values
                )
                body += f"<img src='{image}' alt='{html.escape(panel.title)}'><table><tr><th>series</th><th>last</th></tr>{latest}</table>"
            else:
                body += "<p class='nodata'>No data in this window.</p>"
            items.append(f"<div class='panel'><h3>{html.escape(panel.title)}</h3>{body}</div>")
        if items:
            sections.append(f"<h2>{html.escape(board.title)}</h2>" + "".join(items))
    return sections


def write_report(
    config: ReportConfig, boards: tuple[Board, ...], now: float | None = None, diagnosis_html: str = ""
) -> Path:
    end = time.time() if now is None else now
    start = end - 60 * config.minutes
    config.out_dir.mkdir(parents=True, exist_ok=True)
    prometheus = PrometheusClient(config.prometheus_url, timeout_s=30.0)
    try:
        sections = board_sections(config, prometheus, boards, start, end)
    finally:
        prometheus.close()
    stamp = lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")  # noqa: E731
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>inferd report</title>
<style>body{{font-family:sans-serif;max-width:900px;margin:auto}} .desc{{color:#555;font-size:90%}}
.nodata{{color:#a00}} table{{font-size:80%;border-collapse:collapse}} td,th{{padding:0 8px;text-align:left}}</style>
</head><body>
<h1>inferd report</h1>
<p>{stamp(start)} to {stamp(end)} ({config.minutes} min, step {config.step_s} s) from {html.escape(config.prometheus_url)}</p>
{diagnosis_html}
{"".join(sections)}
</body></html>
"""
    index = config.out_dir / "index.html"
    index.write_text(page)
    return index


REPO = Path(__file__).resolve().parents[1]


def default_output(cwd: Path | None = None) -> Path:
    """`.out/report` in the repository when `cwd` is inside the checkout (git ignores
    `.out/`), else `inferd-report` under `cwd`."""
    cwd = (cwd or Path.cwd()).resolve()
    if (REPO / ".git").exists() and cwd.is_relative_to(REPO):
        return REPO / ".out" / "report"
    return cwd / "inferd-report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prometheus", default="http://localhost:9090", help="Prometheus base URL (default %(default)s)"
    )
    parser.add_argument("--minutes", type=int, default=60, help="how far back to look (default %(default)s)")
    parser.add_argument("--step", type=int, default=15, help="seconds between points (default %(default)s)")
    parser.add_argument(
        "-o",
        "--output",
        "--out",
        dest="out",
        type=Path,
        default=None,
        help="output directory, created if needed; index.html and the PNGs go there "
        "(default: .out/report in the repository when run inside the checkout, else ./inferd-report)",
    )
    parser.add_argument("--agent", default=None, help="the agent's base URL, for the diagnosis section")
    parser.add_argument("--engine", default=None, help="the engine's base URL, for the diagnosis section")
    parser.add_argument(
        "--no-diagnosis", action="store_true", help="leave out the diagnosis section (the `inferd doctor` checks)"
    )


def diagnosis_section(args: argparse.Namespace, config: ReportConfig) -> str:
    """The `inferd doctor` findings over the report's window, as HTML."""
    options = DoctorOptions(
        agent_url=getattr(args, "agent", None),
        engine_url=getattr(args, "engine", None),
        prometheus_url=config.prometheus_url,
        since_s=60.0 * config.minutes,
    )
    return to_html(diagnose(options))


def run(args: argparse.Namespace) -> int:
    from inferd.dashboards.boards import BOARDS

    try:
        out = default_output() if args.out is None else args.out.expanduser().resolve()
        config = ReportConfig(args.prometheus, args.minutes, out, args.step)
        diagnosis = "" if getattr(args, "no_diagnosis", False) else diagnosis_section(args, config)
        index = write_report(config, BOARDS, diagnosis_html=diagnosis)
    except (ValueError, RuntimeError) as exc:  # PrometheusError among them
        print(f"inferd report: {exc}", file=sys.stderr)
        return 1
    print(index)
    return 0
