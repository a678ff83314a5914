"""Alerts as the policy sees them: one alert of an Alertmanager notification, and the book
of what the notifications said (which were handled already, which fire now)."""

from __future__ import annotations

from dataclasses import dataclass

from inferd.agent.remediation_rules import Rule

from .readings import Readings


@dataclass(slots=True, frozen=True)
class Alert:
    """One alert of an Alertmanager notification."""

    status: str  # firing | resolved
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str
    fingerprint: str

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def key(self) -> str:
        return f"{self.fingerprint}|{self.starts_at}|{self.status}"


class AlertBook:
    """The keys of the alerts handled (a notification is idempotent on fingerprint +
    startsAt + status) and the alerts firing by fingerprint, as the notifications say.
    Whether an alert still fires is Prometheus' answer when it gives one."""

    def __init__(self, rules: dict[str, Rule], readings: Readings):
        self._rules = rules
        self._readings = readings
        self._seen: set[str] = set()
        self._firing: dict[str, Alert] = {}

    def is_seen(self, alert: Alert) -> bool:
        return alert.key in self._seen

    def see(self, key: str) -> None:
        self._seen.add(key)

    def fires(self, alert: Alert) -> None:
        self._firing[alert.fingerprint] = alert

    def resolved(self, fingerprint: str) -> None:
        self._firing.pop(fingerprint, None)

    def firing_for(self, rule_action: str) -> list[Alert]:
        """The alerts firing, by the notifications, whose rule has this action."""
        return [a for a in self._firing.values() if a.name in self._rules and self._rules[a.name].action == rule_action]

    def still_firing(self, alert: Alert) -> bool:
        """Prometheus' ALERTS series when it answers (a lost or late notification does not
        matter then), else what the notifications said."""
        firing = self._readings.alert_firing(alert)
        if firing is not None:
            return firing
        return alert.fingerprint in self._firing

    def rule_firing(self, rule_action: str) -> bool:
        """Whether an alert of the rule still fires; one Prometheus no longer sees is dropped
        (its resolved notification was lost)."""
        firing = self.firing_for(rule_action)
        for alert in firing:
            if not self.still_firing(alert):
                self._firing.pop(alert.fingerprint, None)
        return any(a.fingerprint in self._firing for a in firing)
