"""Verification and rollback: each applied step is judged one verification window later
against its target's baseline, credited only if the demand held, and checked against the
guard; a reversible config step that made things worse, or left no value to judge by, is
rolled back."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferd.agent.audit import AuditLog
from inferd.agent.remediation_rules import Plan, PolicyConfig, Rule, credit, guarded, judge

from .actions import Actions
from .counters import Counters
from .in_force import InForce
from .readings import Readings

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Verification:
    action_id: str
    alert: str
    rule_action: str
    plan: Plan
    query: str
    baseline: float | None
    deadline: float
    better: str
    reversible: bool
    fingerprint: str = ""
    demand: float | None = None
    noise: float | None = None  # the target's standard deviation over the window before the step
    guard: float | None = None  # the guard (output tokens/s) before the step

    def to_record(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "baseline": self.baseline,
            "deadline": round(self.deadline, 3),
            "better": self.better,
            "reversible": self.reversible,
            "demand": self.demand,
            "noise": self.noise,
            "guard": self.guard,
        }


class Verifications:
    """The steps waiting for their verification, by action id."""

    def __init__(
        self,
        config: PolicyConfig,
        audit: AuditLog,
        clock: Callable[[], float],
        readings: Readings,
        actions: Actions,
        in_force: InForce,
        counters: Counters,
    ):
        self._config = config
        self._audit = audit
        self._clock = clock
        self._readings = readings
        self._actions = actions
        self._in_force = in_force
        self._counters = counters
        self._pending: dict[str, Verification] = {}

    @property
    def ids(self) -> list[str]:
        return sorted(self._pending)

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, verification: Verification) -> None:
        self._pending[verification.action_id] = verification

    def pop(self, action_id: str) -> Verification | None:
        return self._pending.pop(action_id, None)

    def busy(self, rule: Rule) -> Verification | None:
        """A change being verified that holds this rule back: one of its own, or for a config
        rule any config change (two at once could not be told apart)."""
        busy = [
            v
            for v in self._pending.values()
            if v.rule_action == rule.action or (rule.kind == "config" and v.plan.kind == "config")
        ]
        return busy[0] if busy else None

    def due(self, now: float) -> list[Verification]:
        return [v for v in self._pending.values() if now >= v.deadline]

    def verify(self, v: Verification) -> bool:
        """Judge the step, record it, and roll it back if it hurt; True when rolled back."""
        answer = self._readings.samples(v.query) if self._readings.available else None
        after = max(answer) if answer else None
        demand = self._readings.demand()
        guard = self._readings.guard() if v.plan.kind == "config" else None
        config = self._config
        outcome = guarded(
            credit(
                judge(v.baseline, after, v.better, config.worse_tolerance, v.noise),
                v.demand,
                demand,
                config.demand_drop_tolerance,
            ),
            v.guard,
            guard,
            v.demand,
            demand,
            config.guard_tolerance,
            config.demand_drop_tolerance,
        )
        del self._pending[v.action_id]
        # No value after a change (Prometheus answered, empty) is no evidence it helped: roll it
        # back. A Prometheus that did not answer leaves the change as it is.
        unproven = outcome == "no_data" and answer == []
        worse = outcome in ("worse", "worse_guard")
        roll_back = (worse or unproven) and v.reversible and v.plan.kind == "config"
        self._audit.append(
            "verified",
            id=v.action_id,
            alert=v.alert,
            action=v.plan.action,
            query=v.query,
            baseline=v.baseline,
            after=after,
            demand_before=v.demand,
            demand_after=demand,
            guard_before=v.guard,
            guard_after=guard,
            outcome=outcome,
            decision="rolled_back" if roll_back else "kept",
        )
        log.info("verification of %s (%s): %s -> %s, %s", v.plan.action, v.action_id, v.baseline, after, outcome)
        if roll_back:
            self._roll_back(v, after)
        return roll_back

    def _roll_back(self, v: Verification, after: float | None) -> None:
        self._audit.append(
            "rollback", id=v.action_id, alert=v.alert, action=v.plan.action, old=v.plan.new, new=v.plan.old
        )
        try:
            self._actions.roll_back(v.plan)
        except Exception as exc:
            self._audit.append("rollback_failed", id=v.action_id, alert=v.alert, action=v.plan.action, error=str(exc))
            log.warning("rollback of %s failed: %s", v.plan.action, exc)
            return
        self._in_force.track(v.plan.old, v.plan.new)
        self._counters.rolled_back(v.plan.action, self._clock())
        self._audit.append("rolled_back", id=v.action_id, alert=v.alert, action=v.plan.action, restored=v.plan.old)
        log.warning("rolled back %s: %s went from %s to %s", v.plan.action, v.query, v.baseline, after)
