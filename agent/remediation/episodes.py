"""Episodes: the steps taken for one firing alert (by fingerprint) while it keeps firing.

A config rule's episode takes its next step after each verification, escalating to the
rule's next planner when a step was rolled back; any other episode ends after its one
verified step unless its alert still fires. An ended episode leaves the values it changed
to its rule's pending restore.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from inferd.agent.audit import AuditLog
from inferd.agent.remediation_rules import Plan, Rule

from .alerts import Alert, AlertBook
from .in_force import InForce
from .restore import Restores

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Episode:
    """The steps taken for one firing alert (by fingerprint) while it keeps firing."""

    alert: Alert
    started: float
    steps: int = 0
    planner: int = 0  # index into the rule's planners: where the next step starts looking
    changed: dict[str, Any] = field(default_factory=dict)  # engine setting -> its value before

    def to_record(self) -> dict[str, Any]:
        return {
            "fingerprint": self.alert.fingerprint,
            "steps": self.steps,
            "planner": self.planner,
            "changed": self.changed,
        }


class EpisodeBook:
    """The running episodes by fingerprint, and those whose next step is due."""

    def __init__(
        self,
        rules: dict[str, Rule],
        audit: AuditLog,
        clock: Callable[[], float],
        alerts: AlertBook,
        in_force: InForce,
        restores: Restores,
    ):
        self._rules = rules
        self._audit = audit
        self._clock = clock
        self._alerts = alerts
        self._in_force = in_force
        self._restores = restores
        self.running: dict[str, Episode] = {}  # fingerprint -> its episode
        self._next_step: set[str] = set()  # episodes whose next step waits for another verification

    def get(self, fingerprint: str) -> Episode | None:
        return self.running.get(fingerprint)

    def __contains__(self, fingerprint: str) -> bool:
        return fingerprint in self.running

    def stepped(self, alert: Alert, rule: Rule, plan: Plan, now: float, episode: Episode | None) -> Episode:
        """Count an applied config or mode step; the first one starts the episode, which takes
        over the values of its rule's pending restore."""
        if episode is None:
            episode = self.running[alert.fingerprint] = Episode(alert, now)
            pending = self._restores.take(rule.action)
            if pending is not None:
                episode.changed.update(pending.values)
        episode.steps += 1
        for name, value in plan.old.items():
            episode.changed.setdefault(name, value)
        return episode

    def wait(self, fingerprint: str) -> None:
        """The episode's next step is due at the next tick (or once the change it waits for is verified)."""
        self._next_step.add(fingerprint)

    def next_steps(self) -> Iterator[Episode]:
        for fingerprint in sorted(self._next_step):
            episode = self.running.get(fingerprint)
            self._next_step.discard(fingerprint)
            if episode is not None:
                yield episode

    def verified(self, fingerprint: str, alert: str, rolled_back: bool) -> None:
        episode = self.running.get(fingerprint)
        if episode is None:
            return
        if rolled_back:
            episode.planner += 1  # this knob made it worse: escalate to the rule's next planner
        rule = self._rules.get(alert)
        if rule is not None and rule.kind == "config":
            self._next_step.add(fingerprint)  # a config knob can take another step
        elif not self._alerts.still_firing(episode.alert):
            self.end(fingerprint, "resolved")

    def end(self, fingerprint: str, outcome: str) -> None:
        episode = self.running.pop(fingerprint, None)
        self._next_step.discard(fingerprint)
        if episode is None:
            return
        rule = self._rules.get(episode.alert.name)
        values = {k: v for k, v in episode.changed.items() if k in self._in_force.values}
        restore = None
        if rule is not None:
            restore = self._restores.after_episode(rule, episode.alert.name, values, outcome == "resolved")
        self._audit.append(
            "episode_ended",
            alert=episode.alert.name,
            fingerprint=fingerprint,
            outcome=outcome,
            steps=episode.steps,
            rule_action=rule.action if rule else None,
            restore={"values": restore.values, "due": restore.due and round(restore.due, 3)} if restore else None,
        )
        log.info(
            "remediation episode for %s (%s) ended after %d step(s): %s",
            episode.alert.name,
            fingerprint,
            episode.steps,
            outcome,
        )

    # -- rebuilt from the audit log --

    def resume(self, episode: Episode) -> None:
        self.running[episode.alert.fingerprint] = episode

    def resume_verified(self, fingerprint: str, rolled_back: bool) -> None:
        """A config step of a running episode was verified: its next step is due."""
        self._next_step.add(fingerprint)
        if rolled_back:
            self.running[fingerprint].planner += 1

    def ended(self, fingerprint: str) -> None:
        self.running.pop(fingerprint, None)
        self._next_step.discard(fingerprint)
