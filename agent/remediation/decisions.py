"""Decisions: whether a rule may act now, and the audit record of what was decided.

A rule is held back while a change it would interfere with is being verified, and a new
episode while the rule's cooldown runs (never the next step of a running one). A firing
alert held back is not dropped: Alertmanager will not send the incident again, so it waits,
deferred, until the blocker clears.
"""

from __future__ import annotations

import logging
from typing import Any

from inferd.agent.audit import AuditLog
from inferd.agent.remediation_rules import PolicyConfig, Rule

from .alerts import Alert
from .counters import Counters
from .episodes import Episode
from .verification import Verifications

log = logging.getLogger(__name__)


class Decisions:
    def __init__(self, config: PolicyConfig, audit: AuditLog, counters: Counters, verifications: Verifications):
        self._config = config
        self._audit = audit
        self._counters = counters
        self._verifications = verifications
        self._last_applied: dict[str, float] = {}  # rule action -> when it last changed the engine (or would have)
        self.deferred: dict[str, Alert] = {}  # fingerprint -> firing alert skipped for now

    def blocker(self, rule: Rule, now: float, episode: Episode | None) -> tuple[str, str] | None:
        """Why this rule may not act now (result, detail), or None. The cooldown holds
        back a new episode only, never the next step of a running one."""
        busy = self._verifications.busy(rule)
        if busy is not None:
            return "skipped_verifying", f"{busy.plan.action} (id {busy.action_id}) is being verified"
        last = self._last_applied.get(rule.action)
        if episode is None and last is not None and now - last < self._config.cooldown_s:
            return (
                "skipped_cooldown",
                f"last {rule.action} {now - last:.0f}s ago, cooldown {self._config.cooldown_s:g}s",
            )
        return None

    def applied(self, rule_action: str, ts: float) -> None:
        """The rule acted at `ts` (or would have, in a dry run): its cooldown starts."""
        self._last_applied[rule_action] = ts

    def defer(self, alert: Alert) -> None:
        self.deferred[alert.fingerprint] = alert

    def undefer(self, fingerprint: str) -> None:
        self.deferred.pop(fingerprint, None)

    def decide(self, alert: Alert, rule: Rule, action: str, result: str, **extra: Any) -> dict[str, Any]:
        self._audit.append(
            "decision",
            alert=alert.name,
            fingerprint=alert.fingerprint,
            action=action,
            rule_action=rule.action,
            result=result,
            **extra,
        )
        self._counters.count(alert.name, action, result)
        log.info("remediation for %s: %s %s %s", alert.name, action, result, extra.get("detail", ""))
        return {"alert": alert.name, "status": alert.status, "action": action, "result": result, **extra}
