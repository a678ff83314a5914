"""Remediation latency for KV-cache thrashing: measured with scaled intervals, computed
at production intervals.

    .venv/bin/python scripts/bench_remediation.py [--runs 3]

Runs the thrashing scenario of tests/test_e2e_remediation.py (real Prometheus,
Alertmanager, agent and engine; every duration of alerts/params.yml scaled by the
test's TIME_SCALE) `--runs` times, reads the timeline each run writes, and prints a
Markdown table. It then applies the same latency model to the production values
(alerts/params.yml as committed, prometheus/prometheus.yml's evaluation interval)
and the fault rate the run measured:

  action   = scrape + detect + eval/2 + for + eval/2 + group_wait + agent
             detect: rate(faults[W]) after a step from 0 to R crosses T after W*T/R;
             scrape: the first sample after the onset; eval/2: mean wait for an evaluation
  resolved = action + W*(1 - T/R) + eval       (the rate decays as faults leave W)
  notified = action + k*group_interval          (Alertmanager sends the resolution at
             the group's next flush after it; k = 1 unless the decay outlasts one interval)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "alerts"))
from render import load_params, parse_duration


def model(
    window: float,
    for_: float,
    scrape: float,
    eval_interval: float,
    group_wait: float,
    group_interval: float,
    threshold: float,
    rate: float,
    agent_s: float,
) -> dict[str, float]:
    detect = window * threshold / rate
    action = scrape + detect + eval_interval / 2 + for_ + eval_interval / 2 + group_wait + agent_s
    decay = window * (1 - threshold / rate) + eval_interval / 2
    flushes = max(1, math.ceil(decay / group_interval))
    return {
        "action_s": action,
        "alert_resolved_s": action + decay,
        "resolution_notified_s": action + flushes * group_interval,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--step-fraction",
        type=float,
        default=0.75,
        help="the policy's step_fraction: 0.75 resolves in one step, 0.25 in several (default 0.75)",
    )
    parser.add_argument(
        "--verify-window",
        type=float,
        default=6.0,
        help="the policy's verify_window_s in the scaled run, seconds (default 6)",
    )
    args = parser.parse_args()

    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            timings = Path(tmp) / "timings.json"
            env = {
                **os.environ,
                "INFERD_E2E_TIMINGS": str(timings),
                "INFERD_E2E_STEP_FRACTION": str(args.step_fraction),
                "INFERD_E2E_VERIFY_WINDOW_S": str(args.verify_window),
            }
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-x",
                    "tests/test_e2e_remediation.py",
                    "-k",
                    "thrashing",
                    "-p",
                    "no:cacheprovider",
                ],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
            )
            if result.returncode != 0:
                print(result.stdout[-3000:], file=sys.stderr)
                return 1
            t = json.loads(timings.read_text())["kv_thrashing"]
        runs.append(t)
        print(
            f"run {i + 1}: alert after {t['alert_received'] - t['load_started']:.2f}s, "
            f"action after {t['action_applied'] - t['load_started']:.2f}s, "
            f"resolution notified after {t['resolved_received'] - t['load_started']:.2f}s, "
            f"steps max_num_seqs 16 -> {' -> '.join(map(str, t['steps']))}",
            file=sys.stderr,
        )

    med = lambda key: statistics.median(r[key] - r["load_started"] for r in runs)  # noqa: E731
    agent_s = statistics.median(r["action_applied"] - r["alert_received"] for r in runs)
    rate = statistics.median(r["faults_per_s_peak_before"] for r in runs)
    scale = runs[0]["time_scale"]

    params = load_params()
    d, a, t = params["durations"], params["alertmanager"], params["thresholds"]
    prom = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())
    prod_eval = parse_duration(prom["global"]["evaluation_interval"])
    prod_scrape = parse_duration(prom["global"]["scrape_interval"])
    production = model(
        parse_duration(d["kv_thrashing_window"]),
        parse_duration(d["kv_thrashing_for"]),
        prod_scrape,
        prod_eval,
        parse_duration(a["group_wait"]),
        parse_duration(a["group_interval"]),
        t["kv_page_fault_rate"],
        rate,
        agent_s,
    )
    predicted = model(
        parse_duration(d["kv_thrashing_window"]) * scale,
        parse_duration(d["kv_thrashing_for"]) * scale,
        1.0,
        1.0,
        parse_duration(a["group_wait"]) * scale,
        parse_duration(a["group_interval"]) * scale,
        t["kv_page_fault_rate"],
        rate,
        agent_s,
    )

    print(
        f"| thrashing, {len(runs)} runs (median) | condition -> action applied | -> alert resolved (Prometheus) "
        f"| -> resolution at the agent |"
    )
    print("|---|---|---|---|")
    print(
        f"| measured, durations x{scale:.4g} (1 s scrape/eval) | {med('action_applied'):.1f} s | - "
        f"| {med('resolved_received'):.1f} s |"
    )
    print(
        f"| model, same scaled settings | {predicted['action_s']:.1f} s | {predicted['alert_resolved_s']:.1f} s "
        f"| {predicted['resolution_notified_s']:.1f} s |"
    )
    print(
        f"| model, production ({prod_scrape:g} s scrape/eval, params.yml) | {production['action_s']:.0f} s "
        f"| {production['alert_resolved_s']:.0f} s | {production['resolution_notified_s']:.0f} s |"
    )
    print(
        f"\nfault rate under load {rate:.1f}/s (threshold {t['kv_page_fault_rate']}/s) -> "
        f"{statistics.median(r['faults_per_s_after'] for r in runs):.1f}/s after the action; "
        f"agent: alert received -> change applied {agent_s * 1000:.0f} ms (median); "
        f"requests served in the scenario: {statistics.median(r['requests'] for r in runs):.0f}, all 200; "
        f"step_fraction {args.step_fraction}: {statistics.median(len(r['steps']) for r in runs):.0f} step(s), "
        f"alert received -> resolution at the agent "
        f"{statistics.median(r['resolved_received'] - r['alert_received'] for r in runs):.1f} s (median)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
