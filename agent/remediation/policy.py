"""The remediation policy: what the agent does when an alert reaches its webhook.

An alert that keeps firing is one *episode*: the policy takes a bounded step, verifies
it one window later, and while the alert still fires (Prometheus' ALERTS series, or the
notifications when Prometheus cannot say) takes the next step, up to max_episode_steps;
a step that made the target worse (or left no data to judge it by) is rolled back and
the rule escalates to its next planner, as it does when a knob reaches its bound. The
cooldown separates episodes, not the steps of one. The flow for a firing alert:

    duplicate?  -> ignored (idempotent on fingerprint + startsAt + status)
    no rule?    -> ignored, with a log line
    its episode already running?                     -> in_episode (the episode goes on)
    a change of the same kind still being verified?  -> skipped_verifying  } deferred: acted on
    cooldown of this rule not over?                  -> skipped_cooldown   } once clear, if still firing
    plan from the engine's config; nothing left within bounds -> at_limit
    no baseline for the target?                      -> no_data (nothing to verify against)
    --dry-run   -> dry_run (recorded, engine untouched)
    audit "decision" (fsynced)  ->  engine change  ->  audit "applied" / "failed"
    after verify_window_s: audit "verified" (outcome, kept or rolled_back) -> next step
    or the episode ends; once the alert stays resolved for restore_after_s the values the
    episode changed go back (audit "restore" / "restored").

The policy keeps what it believes is in force on the engine (its changes, not rolled
back or restored); `on_engine_ready` re-applies that to a freshly started engine, or
records that it was reverted when the engine refuses. All state is rebuilt from the
audit log on start (agent.remediation.reload).

Each piece of state has one owner, called under the policy's lock: the alert book (handled
keys, firing alerts), decisions (cooldowns, deferred alerts), episodes, verifications,
restores, what is in force, and the counters.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from inferd.agent.audit import AuditLog
from inferd.agent.engine_client import EngineError
from inferd.agent.remediation_rules import DEFAULT_RULES, PolicyConfig, Rule

from .actions import Actions, EngineAdmin, EngineHost, Refusal
from .alerts import Alert, AlertBook
from .counters import Counters
from .decisions import Decisions
from .episodes import Episode, EpisodeBook
from .in_force import InForce
from .readings import MetricQuery, Readings
from .reload import PolicyState, replay
from .restore import Restores
from .verification import Verification, Verifications

log = logging.getLogger(__name__)


class RemediationPolicy:
    def __init__(
        self,
        engine: EngineAdmin | None,
        audit: AuditLog,
        config: PolicyConfig | None = None,
        metrics: MetricQuery | None = None,
        host: EngineHost | None = None,
        rules: dict[str, Rule] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.engine = engine
        self.audit = audit
        self.config = config or PolicyConfig()
        self.metrics = metrics
        self.host = host
        self.rules = DEFAULT_RULES if rules is None else rules
        self._clock = clock
        self._lock = threading.RLock()
        self._counters = Counters()
        self._readings = Readings(metrics, self.config)
        self._alerts = AlertBook(self.rules, self._readings)
        self._actions = Actions(engine, host, self.config, self._readings)
        self._settings = InForce(audit, clock, self._counters, self._actions)
        self._restores = Restores(
            self.config, audit, clock, self._alerts, self._settings, self._actions, self._counters
        )
        self._verifications = Verifications(
            self.config, audit, clock, self._readings, self._actions, self._settings, self._counters
        )
        self._episode_book = EpisodeBook(self.rules, audit, clock, self._alerts, self._settings, self._restores)
        self._decisions = Decisions(self.config, audit, self._counters, self._verifications)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reload(audit.read())

    # -- the webhook's entry point --

    def handle(self, alert: Alert) -> dict[str, Any]:
        with self._lock:
            if self._alerts.is_seen(alert):
                log.info(
                    "alert %s %s (fingerprint %s, starts %s) already handled; ignored",
                    alert.name,
                    alert.status,
                    alert.fingerprint,
                    alert.starts_at,
                )
                return {"alert": alert.name, "status": alert.status, "result": "duplicate"}
            rule = self.rules.get(alert.name)
            self.audit.append(  # recorded before it counts as seen, so a retry after a failed append is handled
                "alert",
                alert=alert.name,
                status=alert.status,
                fingerprint=alert.fingerprint,
                starts_at=alert.starts_at,
                labels=alert.labels,
                description=alert.annotations.get("description"),
            )
            self._alerts.see(alert.key)
            if rule is None:
                log.info("no remediation rule for alert %r (%s); ignored", alert.name, alert.status)
                return {"alert": alert.name, "status": alert.status, "result": "ignored"}
            if alert.status == "resolved":
                self._alerts.resolved(alert.fingerprint)
                self._decisions.undefer(alert.fingerprint)
                return self._on_resolved(alert, rule)
            self._alerts.fires(alert)
            if alert.fingerprint in self._episode_book:
                return {"alert": alert.name, "status": alert.status, "result": "in_episode"}
            return self._act(alert, rule)

    def _on_resolved(self, alert: Alert, rule: Rule) -> dict[str, Any]:
        # A step still being verified is judged as usual (and rolled back if it hurt);
        # no step follows it.
        self._episode_book.end(alert.fingerprint, "resolved")
        scheduled = self._restores.on_resolved(alert, rule)
        return scheduled or {"alert": alert.name, "status": "resolved", "result": "noted"}

    # -- one step --

    def _act(self, alert: Alert, rule: Rule, episode: Episode | None = None) -> dict[str, Any]:
        now = self._clock()
        decisions, episodes = self._decisions, self._episode_book
        blocker = decisions.blocker(rule, now, episode)
        if blocker is not None:
            result, why = blocker
            if episode is not None:  # the next step waits for the other verification
                episodes.wait(alert.fingerprint)
                return {"alert": alert.name, "status": alert.status, "result": result, "detail": why}
            decisions.defer(alert)  # acted on once the blocker clears, while it fires; see tick()
            return decisions.decide(alert, rule, rule.action, result, detail=f"{why}; deferred while it fires")
        plan = self._actions.plan(alert, rule, episode)
        if isinstance(plan, Refusal):
            refused = decisions.decide(alert, rule, plan.action, plan.result, detail=plan.detail)
            episodes.end(alert.fingerprint, plan.result)
            return refused
        readings = self._readings
        query = readings.target_query(rule, alert)
        baseline = demand = noise = guard = None
        if query and readings.available:
            answer = readings.samples(query)
            if answer == []:  # Prometheus has no value: the condition is gone or unmeasured, nothing to verify by
                episodes.end(alert.fingerprint, "no_data")
                return decisions.decide(alert, rule, plan.action, "no_data", detail=f"no value for {query}")
            if answer is None:  # Prometheus did not answer: act as without it, unverified
                log.warning("no baseline for %s (Prometheus did not answer); acting unverified", alert.name)
                query = None
            else:
                baseline = max(answer)
                demand = readings.demand()
                noise = readings.noise(query)
                guard = readings.guard()
        if self.config.dry_run:
            decisions.applied(rule.action, now)
            return decisions.decide(alert, rule, plan.action, "dry_run", old=plan.old, new=plan.new, baseline=baseline)

        action_id = uuid.uuid4().hex[:12]
        step = {  # what the decision and the applied record both say about this step
            "id": action_id,
            "alert": alert.name,
            "fingerprint": alert.fingerprint,
            "action": plan.action,
            "rule_action": rule.action,
            "kind": plan.kind,
            "old": plan.old,
            "new": plan.new,
        }
        self.audit.append("decision", **step, baseline=baseline, result="apply")
        try:
            detail = self._actions.execute(plan)
        except Exception as exc:  # the engine or the supervisor refused; record, do not crash the webhook
            self.audit.append("failed", id=action_id, alert=alert.name, action=plan.action, error=str(exc))
            self._counters.count(alert.name, plan.action, "failed")
            episodes.end(alert.fingerprint, "failed")
            log.warning("remediation %s for %s failed: %s", plan.action, alert.name, exc)
            return {
                "alert": alert.name,
                "status": alert.status,
                "action": plan.action,
                "result": "failed",
                "error": str(exc),
            }

        decisions.applied(rule.action, now)
        self._counters.changed(plan.action, now)
        self._counters.count(alert.name, plan.action, "applied")
        if plan.kind in ("config", "mode"):
            self._settings.track(plan.new, plan.old)
            episode = episodes.stepped(alert, rule, plan, now, episode)
        verification = None
        if query and readings.available:
            verification = Verification(
                action_id,
                alert.name,
                rule.action,
                plan,
                query,
                baseline,
                now + self.config.verify_window_s,
                rule.better,
                rule.reversible,
                alert.fingerprint,
                demand,
                noise,
                guard,
            )
            self._verifications.add(verification)
        self.audit.append(
            "applied",
            **step,
            detail=detail,
            verify=verification.to_record() if verification else None,
            episode=episode.to_record() if episode else None,
        )
        log.info("remediation %s for %s applied: %s -> %s", plan.action, alert.name, plan.old, plan.new)
        if verification is None:
            episodes.end(alert.fingerprint, "unverified")
        return {
            "alert": alert.name,
            "status": alert.status,
            "action": plan.action,
            "result": "applied",
            "id": action_id,
            "old": plan.old,
            "new": plan.new,
        }

    # -- the clock: verifications, next steps, restores, deferred alerts --

    def tick(self) -> None:
        with self._lock:
            now = self._clock()
            for verification in self._verifications.due(now):
                rolled_back = self._verifications.verify(verification)
                self._episode_book.verified(verification.fingerprint, verification.alert, rolled_back)
            self._restores.tick(now)
            for episode in self._episode_book.next_steps():
                self._continue(episode)
            for fingerprint, alert in list(self._decisions.deferred.items()):
                rule = self.rules.get(alert.name)
                if rule is None or self._decisions.blocker(rule, self._clock(), None) is None:
                    self._decisions.undefer(fingerprint)
                    if rule is not None:
                        log.info("acting on deferred alert %s (fingerprint %s)", alert.name, fingerprint)
                        self._act(alert, rule)

    def _continue(self, episode: Episode) -> None:
        alert = episode.alert
        rule = self.rules.get(alert.name)
        if rule is None or not self._alerts.still_firing(alert):
            self._episode_book.end(alert.fingerprint, "resolved")
            return
        log.info("%s still firing after step %d: next step", alert.name, episode.steps)
        self._act(alert, rule, episode)

    # -- a fresh engine --

    def on_engine_ready(self, generation: int) -> None:
        """Called by the supervisor when a newly started engine answers ready: its config is
        the command line's again, so what the policy has in force is applied once more. If
        the engine refuses, the policy records that its changes were reverted and forgets them."""
        with self._lock:
            if self.engine is None or not self._settings.values or self.config.dry_run:
                return
            try:
                config = self.engine.get_config()
            except EngineError as exc:
                log.warning("engine %d ready, but reading its config failed: %s", generation, exc)
                return
            self._settings.reapply(config, generation)

    # -- the thread --

    def start(self, interval_s: float = 0.5) -> None:
        if self._thread is not None:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.tick()
                except Exception:  # keep verifying later alerts even if one check blew up
                    log.exception("remediation tick failed")

        self._thread = threading.Thread(target=loop, name="remediation", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    # -- what the webhook's /v1/actions shows --

    @property
    def verifying(self) -> list[str]:
        with self._lock:
            return self._verifications.ids

    @property
    def deferred(self) -> list[str]:
        with self._lock:
            return list(self._decisions.deferred)

    @property
    def episodes(self) -> list[str]:
        with self._lock:
            return sorted(self._episode_book.running)

    @property
    def in_force(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._settings.values)

    @property
    def restore_due(self) -> float | None:
        with self._lock:
            return self._restores.due

    # -- what RemediationCollector reads: live dicts it copies without the lock, so a
    # scrape never waits for an engine call --

    @property
    def actions_total(self) -> dict[tuple[str, str, str], int]:
        return self._counters.actions_total

    @property
    def skipped_total(self) -> dict[tuple[str, str], int]:
        return self._counters.skipped_total

    @property
    def rollbacks_total(self) -> dict[str, int]:
        return self._counters.rollbacks_total

    @property
    def reapplied_total(self) -> int:
        return self._counters.reapplied_total

    @property
    def last_action_ts(self) -> dict[str, float]:
        return self._counters.last_action_ts

    @property
    def _episodes(self) -> dict[str, Episode]:
        return self._episode_book.running

    @property
    def _in_force(self) -> dict[str, Any]:
        return self._settings.values

    # -- restart --

    def _reload(self, records: list[dict[str, Any]]) -> None:
        state = PolicyState(
            alerts=self._alerts,
            decisions=self._decisions,
            counters=self._counters,
            in_force=self._settings,
            episodes=self._episode_book,
            verifications=self._verifications,
            restores=self._restores,
        )
        replay(state, records)
        if records:
            log.info(
                "remediation state reloaded from %s: %d records, %d verification(s) resumed, %s in force",
                self.audit.path,
                len(records),
                len(self._verifications),
                self._settings.values or "nothing",
            )
