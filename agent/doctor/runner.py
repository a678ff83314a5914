"""Run the checks over inputs gathered once, rank the findings, pick the exit status."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .check import Check, load_checks
from .findings import Finding, exit_status, ranked, skip
from .inputs import DoctorOptions, Inputs, gather
from .thresholds import DEFAULT, Thresholds

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    findings: tuple[Finding, ...]  # ranked, worst first
    inputs: Inputs

    @property
    def exit_status(self) -> int:
        return exit_status(list(self.findings))


def select(checks: list[Check], only: tuple[str, ...]) -> list[Check]:
    """The checks named in --only (check ids, or finding ids whose check is kept); all when empty."""
    if not only:
        return checks
    known = {c.id for c in checks}
    wanted = {name.split(".", 1)[0] for name in only}
    unknown = sorted(wanted - known)
    if unknown:
        raise ValueError(f"--only: unknown check(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return [c for c in checks if c.id in wanted]


def run_checks(inputs: Inputs, thresholds: Thresholds = DEFAULT) -> list[Finding]:
    only = inputs.options.only
    findings: list[Finding] = []
    for check in select(load_checks(), only):
        if check.active_only and not inputs.options.active:
            findings.append(
                skip(check.id, "all", check.layer, check.description, "loads the GPU and host: run with --active")
            )
            continue
        try:
            found = check.run(inputs, thresholds)
        except Exception as exc:  # one broken check must not hide the others
            log.exception("check %s failed", check.id)
            found = [skip(check.id, "error", check.layer, check.description, f"{type(exc).__name__}: {exc}")]
        findings.extend(found)
    finding_ids = [name for name in only if "." in name]
    if finding_ids:
        unknown = sorted(set(finding_ids) - {f.id for f in findings})
        if unknown:
            known = ", ".join(sorted(f.id for f in findings))
            raise ValueError(f"--only: no finding {', '.join(unknown)}; these checks give {known}")
        findings = [f for f in findings if f.id in finding_ids or f.check in only]
    return ranked(findings)


def diagnose(options: DoctorOptions, thresholds: Thresholds = DEFAULT) -> Diagnosis:
    select(load_checks(), options.only)  # a bad --only fails before any input is read
    inputs = gather(options)
    return Diagnosis(tuple(run_checks(inputs, thresholds)), inputs)
