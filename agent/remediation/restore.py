"""Restores: the values an ended episode changed go back once its rule's alerts have stayed
resolved for restore_after_s.

One pending restore per rule action. A new episode of the rule takes over its values (the
older value is the original); the quiet period starts when no alert of the rule fires and
starts again whenever one does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferd.agent.audit import AuditLog
from inferd.agent.remediation_rules import PolicyConfig, Rule

from .actions import Actions
from .alerts import Alert, AlertBook
from .counters import Counters
from .in_force import InForce

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Restore:
    """Values an ended episode changed, to go back once its rule's alerts have stayed
    resolved for restore_after_s: `due` is when that quiet period ends (None while an
    alert of the rule still fires)."""

    rule_action: str
    alert: str
    values: dict[str, Any]
    due: float | None
    checked_at: float = 0.0


class Restores:
    def __init__(
        self,
        config: PolicyConfig,
        audit: AuditLog,
        clock: Callable[[], float],
        alerts: AlertBook,
        in_force: InForce,
        actions: Actions,
        counters: Counters,
    ):
        self._config = config
        self._audit = audit
        self._clock = clock
        self._alerts = alerts
        self._in_force = in_force
        self._actions = actions
        self._counters = counters
        self._pending: dict[str, Restore] = {}  # rule action -> pending restore

    @property
    def due(self) -> float | None:
        return min((r.due for r in self._pending.values() if r.due is not None), default=None)

    def take(self, rule_action: str) -> Restore | None:
        """The rule's pending restore, which a new episode of the rule takes over."""
        return self._pending.pop(rule_action, None)

    def put(self, restore: Restore) -> None:
        self._pending[restore.rule_action] = restore

    def done(self, rule_action: str) -> None:
        self._pending.pop(rule_action, None)

    def after_episode(self, rule: Rule, alert: str, values: dict[str, Any], resolved: bool) -> Restore | None:
        """The restore an episode leaves behind: the values it changed that are still in
        force, merged into the rule's pending restore. Its quiet period starts now if its
        alert resolved; an episode that ended for any other reason waits for that."""
        if not (rule.restores and values):
            return None
        pending = self._pending.get(rule.action)
        merged = {**values, **(pending.values if pending else {})}  # the older value is the original
        due = self._clock() + self._config.restore_after_s if resolved else None
        restore = self._pending[rule.action] = Restore(rule.action, alert, merged, due)
        return restore

    def on_resolved(self, alert: Alert, rule: Rule) -> dict[str, Any] | None:
        """The webhook's answer when the resolved alert leaves a restore pending, else None."""
        restore = self._pending.get(rule.action)
        if restore is None:
            return None
        others = self._alerts.firing_for(rule.action)
        if restore.due is None and not others:  # the quiet period starts now
            restore.due = self._clock() + self._config.restore_after_s
        return {
            "alert": alert.name,
            "status": "resolved",
            "result": "restore_scheduled",
            "restore_in_s": None if restore.due is None else round(restore.due - self._clock(), 3),
        }

    def tick(self, now: float) -> None:
        for restore in list(self._pending.values()):
            self._tick(restore, now)

    def _tick(self, restore: Restore, now: float) -> None:
        """Prometheus is asked at most every few seconds."""
        if restore.due is not None and now < restore.due:
            return
        if now - restore.checked_at < min(5.0, self._config.restore_after_s / 2):
            return
        restore.checked_at = now
        if self._alerts.rule_firing(restore.rule_action):
            restore.due = None
        elif restore.due is None:
            restore.due = now + self._config.restore_after_s
        else:
            self._restore(restore)

    def _restore(self, restore: Restore) -> None:
        del self._pending[restore.rule_action]
        in_force = self._in_force.values
        values = {k: v for k, v in restore.values.items() if k in in_force}
        if not values:
            return
        action = "restore_fast" if set(values) == {"mode"} else f"restore_{restore.rule_action}"
        current = {k: in_force[k] for k in values}
        self._audit.append(
            "restore", alert=restore.alert, action=action, rule_action=restore.rule_action, old=current, new=values
        )
        try:
            self._actions.apply_values(values)
        except Exception as exc:
            self._audit.append("restore_failed", alert=restore.alert, action=action, error=str(exc))
            self._counters.count(restore.alert, action, "failed")
            log.warning("restoring %s failed: %s", values, exc)
            return
        self._in_force.track(values, current)
        self._counters.changed(action, self._clock())
        self._counters.count(restore.alert, action, "applied")
        self._audit.append(
            "restored", alert=restore.alert, action=action, rule_action=restore.rule_action, restored=values
        )
        log.info("restored %s after %s stayed resolved", values, restore.alert)
