"""What a check says: `Finding`s, each with a status, an impact for ranking, the
evidence it rests on (every number with where it came from) and the fix.

Statuses, worst first: fail (the node loses throughput or correctness now), warn (it
may, or a setting is off), skip (the check could not run here, `reason` says why), ok.
`impact` (0 to 1) is the rough share of the node's throughput at stake; findings are
ranked by status, then impact, then id, so the order is stable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

STATUSES = ("fail", "warn", "skip", "ok")  # worst first
LAYERS = ("numa", "pcie", "gpu", "engine", "kv_cache", "load", "host")
_RANK = {status: rank for rank, status in enumerate(STATUSES)}


@dataclass(frozen=True, slots=True)
class Evidence:
    """One observed number (or short text) and where it was read: `sysfs:<path>`,
    `procfs:<path>`, `agent:/metrics <series>`, `engine:/metrics <series>`,
    `engine:/admin/config`, `prometheus:<expr>`, `nvml`, `replay:<path>`, `sweep:<path>`,
    `measured` (an --active copy)."""

    name: str
    value: float | int | str | bool | None
    source: str
    unit: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.source:
            raise ValueError(f"evidence needs a name and a source, got {self.name!r}, {self.source!r}")

    def to_dict(self) -> dict[str, Any]:
        value = self.value
        if isinstance(value, float):
            value = round(value, 6)
        return {"name": self.name, "value": value, "unit": self.unit, "source": self.source}


@dataclass(frozen=True, slots=True)
class Finding:
    id: str  # "<check>.<what>", e.g. "pcie.link"
    check: str  # the check that produced it, e.g. "pcie"
    layer: str
    status: str
    title: str
    summary: str
    impact: float = 0.0
    evidence: tuple[Evidence, ...] = ()
    fix: str | None = None
    reason: str | None = None  # why it was skipped
    not_judged: tuple[str, ...] = ()  # what it could not judge with the inputs given

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"finding {self.id!r}: status must be one of {STATUSES}, got {self.status!r}")
        if self.layer not in LAYERS:
            raise ValueError(f"finding {self.id!r}: layer must be one of {LAYERS}, got {self.layer!r}")
        if not self.id.startswith(self.check + "."):
            raise ValueError(f"finding id {self.id!r} must start with its check {self.check!r} and a dot")
        if not 0.0 <= self.impact <= 1.0:
            raise ValueError(f"finding {self.id!r}: impact must be in [0, 1], got {self.impact}")
        if self.status == "skip" and not self.reason:
            raise ValueError(f"finding {self.id!r}: a skip needs its reason")
        if self.status in ("warn", "fail") and not self.fix:
            raise ValueError(f"finding {self.id!r}: a {self.status} needs its fix")

    @property
    def rank(self) -> tuple[int, float, str]:
        return (_RANK[self.status], -self.impact, self.id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "check": self.check,
            "layer": self.layer,
            "status": self.status,
            "title": self.title,
            "summary": self.summary,
            "impact": round(self.impact, 4),
            "evidence": [e.to_dict() for e in self.evidence],
            "fix": self.fix,
            "reason": self.reason,
            "not_judged": list(self.not_judged),
        }


def skip(check: str, what: str, layer: str, title: str, reason: str) -> Finding:
    return Finding(f"{check}.{what}", check, layer, "skip", title, f"not run: {reason}", reason=reason)


@dataclass(frozen=True, slots=True)
class FindingMaker:
    """One check's findings: the id `<check>.<what>`, the check and its layer are fixed and
    the title is looked up by `what` (`titles` as a mapping) or the same for all (a string);
    the rest is given by keyword."""

    check: str
    layer: str
    titles: Mapping[str, str] | str

    def title(self, what: str) -> str:
        return self.titles if isinstance(self.titles, str) else self.titles[what]

    def __call__(
        self,
        what: str,
        status: str,
        summary: str,
        *,
        impact: float = 0.0,
        evidence: Iterable[Evidence] = (),
        fix: str | None = None,
        not_judged: Iterable[str] = (),
        layer: str | None = None,
    ) -> Finding:
        return Finding(
            f"{self.check}.{what}",
            self.check,
            layer or self.layer,
            status,
            self.title(what),
            summary,
            impact,
            tuple(evidence),
            fix,
            not_judged=tuple(not_judged),
        )

    def ok(
        self,
        what: str,
        summary: str,
        evidence: Iterable[Evidence] = (),
        *,
        not_judged: Iterable[str] = (),
        layer: str | None = None,
    ) -> Finding:
        return self(what, "ok", summary, evidence=evidence, not_judged=not_judged, layer=layer)

    def skip(self, what: str, reason: str) -> Finding:
        return skip(self.check, what, self.layer, self.title(what), reason)


def ranked(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: f.rank)


def exit_status(findings: list[Finding]) -> int:
    """0 when nothing warns or fails, 1 with a warning, 2 with a failure (skips count as ok)."""
    statuses = {f.status for f in findings}
    return 2 if "fail" in statuses else 1 if "warn" in statuses else 0
