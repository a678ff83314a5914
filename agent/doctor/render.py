"""The report two ways: a terminal table (worst first, colour only on a TTY, evidence
and fix under each finding that is not ok) and stable JSON (agent.doctor.schema)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from .findings import STATUSES
from .runner import Diagnosis
from .schema import SCHEMA_VERSION

COLOURS = {"fail": "\033[31m", "warn": "\033[33m", "skip": "\033[2m", "ok": "\033[32m"}
RESET = "\033[0m"


def to_dict(diagnosis: Diagnosis) -> dict[str, Any]:
    options = diagnosis.inputs.options
    counts = Counter(f.status for f in diagnosis.findings)
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": round(diagnosis.inputs.now, 3),
        "exit_status": diagnosis.exit_status,
        "counts": {s: counts.get(s, 0) for s in STATUSES},
        "inputs": {
            "agent": options.agent_url,
            "engine": options.engine_url,
            "prometheus": options.prometheus_url,
            "since_seconds": options.since_s,
            "sysfs_root": options.sysfs_root,
            "procfs_root": options.procfs_root,
            "gpu_backend": options.gpu_backend,
            "active": options.active,
            "missing": dict(sorted(diagnosis.inputs.missing.items())),
            "found": dict(options.found),
        },
        "findings": [f.to_dict() for f in diagnosis.findings],
    }


def to_json(diagnosis: Diagnosis) -> str:
    return json.dumps(to_dict(diagnosis), indent=2, sort_keys=True) + "\n"


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def to_text(diagnosis: Diagnosis, colour: bool = False) -> str:
    def paint(status: str, text: str) -> str:
        return f"{COLOURS[status]}{text}{RESET}" if colour else text

    findings = diagnosis.findings
    width = max((len(f.id) for f in findings), default=10)
    lines = endpoint_lines(diagnosis)
    lines.append(f"{'STATUS':<6}  {'CHECK':<{width}}  SUMMARY")
    for f in findings:
        lines.append(
            f"{paint(f.status, f.status.upper()):<6}  {f.id:<{width}}  {f.summary if f.status != 'skip' else f.reason}"
        )
    details = [f for f in findings if f.status in ("fail", "warn")]
    for f in details:
        lines += ["", paint(f.status, f"{f.status.upper()} {f.id}: {f.title}"), f"  {f.summary}"]
        for e in f.evidence:
            unit = f" {e.unit}" if e.unit else ""
            lines.append(f"  - {e.name} = {_value(e.value)}{unit}  [{e.source}]")
        lines.append(f"  fix: {f.fix}")
    not_judged = [(f.id, n) for f in findings for n in f.not_judged]
    if not_judged:
        lines += ["", "not judged:"] + [f"  {fid}: {text}" for fid, text in not_judged]
    counts = Counter(f.status for f in findings)
    lines += ["", ", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES) + f"; exit status {diagnosis.exit_status}"]
    return "\n".join(lines) + "\n"


def endpoint_lines(diagnosis: Diagnosis) -> list[str]:
    """The endpoints the doctor read and where each came from, then a blank line; nothing
    when it did not look (--no-discover)."""
    options = diagnosis.inputs.options
    if not options.found:
        return []
    urls = {"agent": options.agent_url, "engine": options.engine_url, "prometheus": options.prometheus_url}
    lines = []
    for name, where in options.found:
        url = urls.get(name)
        lines.append(f"{name:<11} {url}  ({where})" if url else f"{name:<11} {where}")
    return [*lines, ""]


def to_html(diagnosis: Diagnosis) -> str:
    """The findings as an HTML section (for `inferd report`): a table, worst first, with
    the evidence and fix of each finding that is not ok."""
    import html

    colours = {"fail": "#c4162a", "warn": "#e0b400", "skip": "#888", "ok": "#37872d"}
    rows = []
    for f in diagnosis.findings:
        text = f.summary if f.status != "skip" else f.reason or ""
        detail = ""
        if f.status in ("fail", "warn"):
            items = "".join(
                f"<li>{html.escape(e.name)} = {html.escape(_value(e.value))} {html.escape(e.unit)} "
                f"<span class='desc'>[{html.escape(e.source)}]</span></li>"
                for e in f.evidence
            )
            detail = f"<ul>{items}</ul><p><b>fix:</b> {html.escape(f.fix or '')}</p>"
        rows.append(
            f"<tr><td style='color:{colours[f.status]}'><b>{f.status.upper()}</b></td>"
            f"<td>{html.escape(f.id)}</td><td>{html.escape(text)}{detail}</td></tr>"
        )
    counts = Counter(f.status for f in diagnosis.findings)
    tally = ", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES)
    return (
        f"<h2>Diagnosis</h2><p>inferd doctor: {tally} (docs/DOCTOR.md)</p>"
        f"<table><tr><th>status</th><th>check</th><th>finding</th></tr>{''.join(rows)}</table>"
    )
