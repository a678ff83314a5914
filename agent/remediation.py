"""Remediation policy: what the agent does when an alert reaches its webhook.

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
records that it was reverted when the engine refuses. All state (cooldowns,
de-duplication keys, episodes, verifications, deferred alerts, pending restores, what is
in force) is rebuilt from the audit log on start.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from inferd.agent.audit import AuditLog
from inferd.agent.engine_client import EngineError
from inferd.agent.remediation_rules import (
    DEFAULT_RULES,
    Bounds,  # noqa: F401 (re-exported)
    Facts,
    Plan,
    PolicyConfig,
    Rule,
    credit,
    guarded,
    judge,
)

log = logging.getLogger(__name__)

ACTION_RESULTS = ("applied", "dry_run", "failed")
SKIP_RESULTS = ("skipped_cooldown", "skipped_verifying", "at_limit", "unsupported", "no_data")
RESULTS = ACTION_RESULTS + SKIP_RESULTS


# ---- what crosses the boundaries ------------------------------------------------------


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


class EngineHost(Protocol):
    """What the agent's supervisor offers the policy (both return a line for the log)."""

    def restart_engine(self) -> str: ...

    def rebind_engine(self) -> str: ...


class EngineAdmin(Protocol):
    def get_config(self) -> dict[str, Any]: ...

    def patch_config(self, changes: dict[str, Any]) -> dict[str, Any]: ...

    def set_mode(self, mode: str) -> dict[str, Any]: ...


class MetricQuery(Protocol):
    def value(self, query: str) -> float | None: ...


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


# ---- the policy ----------------------------------------------------------------------


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
        self._seen: set[str] = set()
        self._last_applied: dict[str, float] = {}
        self._verifying: dict[str, Verification] = {}
        self._deferred: dict[str, Alert] = {}  # fingerprint -> firing alert skipped for now
        self._episodes: dict[str, Episode] = {}  # fingerprint -> its episode
        self._next_step: set[str] = set()  # episodes whose next step waits for another verification
        self._firing: dict[str, Alert] = {}  # fingerprint -> alert, as the notifications say
        self._restores: dict[str, Restore] = {}  # rule action -> pending restore
        self._in_force: dict[str, Any] = {}  # engine setting -> the value the policy set
        self._original: dict[str, Any] = {}  # engine setting -> its value before the policy's first change
        self.actions_total: dict[tuple[str, str, str], int] = {}
        self.skipped_total: dict[tuple[str, str], int] = {}
        self.rollbacks_total: dict[str, int] = {}
        self.reapplied_total = 0
        self.last_action_ts: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reload(audit.read())

    # -- the webhook's entry point --

    def handle(self, alert: Alert) -> dict[str, Any]:
        with self._lock:
            if alert.key in self._seen:
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
            self._seen.add(alert.key)
            if rule is None:
                log.info("no remediation rule for alert %r (%s); ignored", alert.name, alert.status)
                return {"alert": alert.name, "status": alert.status, "result": "ignored"}
            if alert.status == "resolved":
                self._firing.pop(alert.fingerprint, None)
                self._deferred.pop(alert.fingerprint, None)
                return self._on_resolved(alert, rule)
            self._firing[alert.fingerprint] = alert
            if alert.fingerprint in self._episodes:
                return {"alert": alert.name, "status": alert.status, "result": "in_episode"}
            return self._act(alert, rule)

    # -- decisions --

    def _blocker(self, rule: Rule, now: float, episode: Episode | None) -> tuple[str, str] | None:
        """Why this rule may not act now (result, detail), or None. The cooldown holds
        back a new episode only, never the next step of a running one."""
        busy = [
            v
            for v in self._verifying.values()
            if v.rule_action == rule.action or (rule.kind == "config" and v.plan.kind == "config")
        ]
        if busy:
            return "skipped_verifying", f"{busy[0].plan.action} (id {busy[0].action_id}) is being verified"
        last = self._last_applied.get(rule.action)
        if episode is None and last is not None and now - last < self.config.cooldown_s:
            return "skipped_cooldown", f"last {rule.action} {now - last:.0f}s ago, cooldown {self.config.cooldown_s:g}s"
        return None

    def _act(self, alert: Alert, rule: Rule, episode: Episode | None = None) -> dict[str, Any]:
        now = self._clock()
        blocker = self._blocker(rule, now, episode)
        if blocker is not None:
            result, why = blocker
            if episode is not None:  # the next step waits for the other verification
                self._next_step.add(alert.fingerprint)
                return {"alert": alert.name, "status": alert.status, "result": result, "detail": why}
            # Not dropped: Alertmanager will not send this incident again, so it waits
            # (while it keeps firing) until the blocker clears; see tick().
            self._deferred[alert.fingerprint] = alert
            return self._decide(alert, rule, rule.action, result, detail=f"{why}; deferred while it fires")
        plan = self._plan(alert, rule, episode)
        if isinstance(plan, dict):
            self._end_episode(alert.fingerprint, plan["result"])
            return plan
        query = self._target_query(rule, alert)
        baseline = demand = noise = guard = None
        if query and self.metrics:
            answer = self._query(query)
            if answer == []:  # Prometheus has no value: the condition is gone or unmeasured, nothing to verify by
                self._end_episode(alert.fingerprint, "no_data")
                return self._decide(alert, rule, plan.action, "no_data", detail=f"no value for {query}")
            if answer is None:  # Prometheus did not answer: act as without it, unverified
                log.warning("no baseline for %s (Prometheus did not answer); acting unverified", alert.name)
                query = None
            else:
                baseline = max(answer)
                demand = self.metrics.value(self.config.demand_query.format(engine=self.config.engine_selector))
                noise = self.metrics.value(f"stddev_over_time(({query})[{self._window()}:])")
                guard = self._guard_value()
        if self.config.dry_run:
            self._last_applied[rule.action] = now
            return self._decide(alert, rule, plan.action, "dry_run", old=plan.old, new=plan.new, baseline=baseline)

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
            detail = self._execute(plan)
        except Exception as exc:  # the engine or the supervisor refused; record, do not crash the webhook
            self.audit.append("failed", id=action_id, alert=alert.name, action=plan.action, error=str(exc))
            self._count(alert.name, plan.action, "failed")
            self._end_episode(alert.fingerprint, "failed")
            log.warning("remediation %s for %s failed: %s", plan.action, alert.name, exc)
            return {
                "alert": alert.name,
                "status": alert.status,
                "action": plan.action,
                "result": "failed",
                "error": str(exc),
            }

        self._last_applied[rule.action] = now
        self.last_action_ts[plan.action] = now
        self._count(alert.name, plan.action, "applied")
        if plan.kind in ("config", "mode"):
            self._track(plan.new, plan.old)
            if episode is None:
                episode = self._episodes[alert.fingerprint] = Episode(alert, now)
                pending = self._restores.pop(rule.action, None)  # this episode takes over its values
                if pending is not None:
                    episode.changed.update(pending.values)
            episode.steps += 1
            for name, value in plan.old.items():
                episode.changed.setdefault(name, value)
        verification = None
        if query and self.metrics:
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
            self._verifying[action_id] = verification
        self.audit.append(
            "applied",
            **step,
            detail=detail,
            verify=verification.to_record() if verification else None,
            episode=episode.to_record() if episode else None,
        )
        log.info("remediation %s for %s applied: %s -> %s", plan.action, alert.name, plan.old, plan.new)
        if verification is None:
            self._end_episode(alert.fingerprint, "unverified")
        return {
            "alert": alert.name,
            "status": alert.status,
            "action": plan.action,
            "result": "applied",
            "id": action_id,
            "old": plan.old,
            "new": plan.new,
        }

    def _plan(self, alert: Alert, rule: Rule, episode: Episode | None) -> Plan | dict[str, Any]:
        if rule.kind == "restart":
            return self._host_plan(alert, rule, "restart_engine", Plan("restart_engine", "restart", {}, {}))
        if rule.kind == "rebind":
            return self._host_plan(alert, rule, "rebind_engine", Plan("rebind_numa", "rebind", {}, {}))
        if self.engine is None:
            return self._decide(alert, rule, rule.action, "unsupported", detail="no engine admin API configured")
        if episode is not None and episode.steps >= self.config.max_episode_steps:
            return self._decide(
                alert,
                rule,
                rule.action,
                "at_limit",
                detail=f"{episode.steps} steps taken, max_episode_steps {self.config.max_episode_steps}",
            )
        try:
            config = self.engine.get_config()
            facts = self._facts(alert, rule) if rule.uses_facts else Facts()
            reasons = []
            for index in range(episode.planner if episode else 0, len(rule.planners)):
                plan = rule.planners[index](config, self.config, facts)
                if isinstance(plan, Plan):
                    if episode is not None:
                        episode.planner = index
                    return plan
                reasons.append(plan)
        except (EngineError, KeyError, ValueError, TypeError) as exc:
            return self._decide(alert, rule, rule.action, "failed", detail=f"reading the engine's config: {exc}")
        return self._decide(alert, rule, rule.action, "at_limit", detail="; ".join(reasons) or "no planner left")

    def _host_plan(self, alert: Alert, rule: Rule, method: str, plan: Plan) -> Plan | dict[str, Any]:
        if self.host is None or not hasattr(self.host, method):
            return self._decide(alert, rule, plan.action, "unsupported", detail=f"no supervisor offering {method}")
        return plan

    @property
    def _admin(self) -> EngineAdmin:
        """The engine's admin API: there is one wherever an engine setting changes (_plan
        makes no config or mode plan without it, and only applied plans are verified,
        rolled back or restored)."""
        assert self.engine is not None
        return self.engine

    @property
    def _supervisor(self) -> EngineHost:
        """The engine's supervisor: _host_plan makes restart and rebind plans only with one."""
        assert self.host is not None
        return self.host

    def _execute(self, plan: Plan) -> str | None:
        if plan.kind == "config":
            return f"engine config now {self._admin.patch_config(plan.new)}"
        if plan.kind == "mode":
            self._admin.set_mode(plan.new["mode"])
            return None
        if plan.kind == "restart":
            return self._supervisor.restart_engine()
        if plan.kind == "rebind":
            return self._supervisor.rebind_engine()
        raise ValueError(f"unknown plan kind {plan.kind!r}")

    def _apply_values(self, values: dict[str, Any]) -> None:
        """Engine settings, the mode included, through the admin API."""
        tunables = {k: v for k, v in values.items() if k != "mode"}
        if tunables:
            self._admin.patch_config(tunables)
        if "mode" in values:
            self._admin.set_mode(values["mode"])

    def _track(self, new: dict[str, Any], old: dict[str, Any]) -> None:
        """Keep what is in force: the policy's values that differ from the engine's own."""
        for name, value in new.items():
            self._original.setdefault(name, old.get(name))
            if value == self._original[name]:
                self._in_force.pop(name, None)
                self._original.pop(name, None)
            else:
                self._in_force[name] = value

    def _decide(self, alert: Alert, rule: Rule, action: str, result: str, **extra: Any) -> dict[str, Any]:
        self.audit.append(
            "decision",
            alert=alert.name,
            fingerprint=alert.fingerprint,
            action=action,
            rule_action=rule.action,
            result=result,
            **extra,
        )
        self._count(alert.name, action, result)
        log.info("remediation for %s: %s %s %s", alert.name, action, result, extra.get("detail", ""))
        return {"alert": alert.name, "status": alert.status, "action": action, "result": result, **extra}

    def _on_resolved(self, alert: Alert, rule: Rule) -> dict[str, Any]:
        # A step still being verified is judged as usual (and rolled back if it hurt);
        # no step follows it.
        self._end_episode(alert.fingerprint, "resolved")
        restore = self._restores.get(rule.action)
        if restore is not None:
            others = [
                a
                for a in self._firing.values()
                if self.rules.get(a.name) is not None and self.rules[a.name].action == rule.action
            ]
            if restore.due is None and not others:  # the quiet period starts now
                restore.due = self._clock() + self.config.restore_after_s
            return {
                "alert": alert.name,
                "status": "resolved",
                "result": "restore_scheduled",
                "restore_in_s": None if restore.due is None else round(restore.due - self._clock(), 3),
            }
        return {"alert": alert.name, "status": "resolved", "result": "noted"}

    def _end_episode(self, fingerprint: str, outcome: str) -> None:
        episode = self._episodes.pop(fingerprint, None)
        self._next_step.discard(fingerprint)
        if episode is None:
            return
        rule = self.rules.get(episode.alert.name)
        values = {k: v for k, v in episode.changed.items() if k in self._in_force}
        restore = None
        if rule is not None and rule.restores and values:
            pending = self._restores.get(rule.action)
            merged = {**values, **(pending.values if pending else {})}  # the older value is the original
            # an episode that ended for any other reason than its alert resolving waits for it
            due = self._clock() + self.config.restore_after_s if outcome == "resolved" else None
            restore = Restore(rule.action, episode.alert.name, merged, due)
            self._restores[rule.action] = restore
        self.audit.append(
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

    def _still_firing(self, alert: Alert) -> bool:
        """Prometheus' ALERTS series when it answers (a lost or late notification does not
        matter then), else what the notifications said."""
        samples = None
        if self.metrics is not None and hasattr(self.metrics, "samples"):
            labels = "".join(f',{k}="{alert.labels[k]}"' for k in ("job", "instance") if alert.labels.get(k))
            samples = self.metrics.samples(f'ALERTS{{alertname="{alert.name}",alertstate="firing"{labels}}}')
        if samples is not None:
            return bool(samples)
        return alert.fingerprint in self._firing

    def _facts(self, alert: Alert, rule: Rule) -> Facts:
        if not self.metrics:
            return Facts()
        sel = self._selector(alert) if rule.labels_name_engine else self.config.engine_selector
        return Facts(
            kv_usage=self.metrics.value(f"max(vllm:kv_cache_usage_perc{{{sel}}})"),
            waiting=self.metrics.value(f"sum(vllm:num_requests_waiting{{{sel}}})"),
            prompt_tokens=self.metrics.value(
                f"sum(rate(vllm:request_prompt_tokens_sum{{{sel}}}[{self._window()}]))"
                f" / sum(rate(vllm:request_prompt_tokens_count{{{sel}}}[{self._window()}]))"
            ),
        )

    def _guard_value(self) -> float | None:
        if not self.metrics or not self.config.guard_query:
            return None
        return self.metrics.value(
            self.config.guard_query.format(engine=self.config.engine_selector, window=self._window())
        )

    def _selector(self, alert: Alert) -> str:
        sel = ",".join(f'{k}="{alert.labels[k]}"' for k in ("job", "instance") if alert.labels.get(k))
        return sel or self.config.engine_selector  # an empty selector is not valid PromQL

    def _query(self, query: str) -> list[float] | None:
        """Sample values ([] when none), or None when the query itself failed."""
        metrics = self.metrics
        assert metrics is not None  # callers query only with a metrics source
        if hasattr(metrics, "samples"):
            return metrics.samples(query)
        value = metrics.value(query)
        return [] if value is None else [value]

    def _rule_firing(self, rule_action: str) -> bool:
        firing = [a for a in self._firing.values() if a.name in self.rules and self.rules[a.name].action == rule_action]
        for alert in firing:
            if not self._still_firing(alert):
                self._firing.pop(alert.fingerprint, None)  # its resolved notification was lost
        return any(a.fingerprint in self._firing for a in firing)

    def _target_query(self, rule: Rule, alert: Alert) -> str | None:
        if not rule.target:
            return None
        return rule.target.format(sel=self._selector(alert), engine=self.config.engine_selector, window=self._window())

    def _window(self) -> str:
        # The second half of the verification window: a change settles first (lowering
        # max_num_seqs preempts sequences, a burst of faults that is no verdict on it).
        return f"{max(1, round(self.config.verify_window_s / 2))}s"

    def _count(self, alert: str, action: str, result: str) -> None:
        if result in SKIP_RESULTS:
            key2 = (alert, result)
            self.skipped_total[key2] = self.skipped_total.get(key2, 0) + 1
            return
        key = (alert, action, result)
        self.actions_total[key] = self.actions_total.get(key, 0) + 1

    # -- the clock: verifications, next steps, restores --

    def tick(self) -> None:
        with self._lock:
            now = self._clock()
            for verification in [v for v in self._verifying.values() if now >= v.deadline]:
                self._verify(verification)
            for restore in list(self._restores.values()):
                self._tick_restore(restore, now)
            for fingerprint in sorted(self._next_step):
                episode = self._episodes.get(fingerprint)
                self._next_step.discard(fingerprint)
                if episode is not None:
                    self._continue(episode)
            for fingerprint, alert in list(self._deferred.items()):
                rule = self.rules.get(alert.name)
                if rule is None or self._blocker(rule, self._clock(), None) is None:
                    del self._deferred[fingerprint]
                    if rule is not None:
                        log.info("acting on deferred alert %s (fingerprint %s)", alert.name, fingerprint)
                        self._act(alert, rule)

    def _tick_restore(self, restore: Restore, now: float) -> None:
        """The quiet period starts when no alert of the rule fires and restarts whenever one
        does; Prometheus is asked at most every few seconds."""
        if restore.due is not None and now < restore.due:
            return
        if now - restore.checked_at < min(5.0, self.config.restore_after_s / 2):
            return
        restore.checked_at = now
        if self._rule_firing(restore.rule_action):
            restore.due = None
        elif restore.due is None:
            restore.due = now + self.config.restore_after_s
        else:
            self._restore(restore)

    def _continue(self, episode: Episode) -> None:
        alert = episode.alert
        rule = self.rules.get(alert.name)
        if rule is None or not self._still_firing(alert):
            self._end_episode(alert.fingerprint, "resolved")
            return
        log.info("%s still firing after step %d: next step", alert.name, episode.steps)
        self._act(alert, rule, episode)

    def _verify(self, v: Verification) -> None:
        answer = self._query(v.query) if self.metrics else None
        after = max(answer) if answer else None
        demand = (
            self.metrics.value(self.config.demand_query.format(engine=self.config.engine_selector))
            if self.metrics
            else None
        )
        guard = self._guard_value() if v.plan.kind == "config" else None
        outcome = guarded(
            credit(
                judge(v.baseline, after, v.better, self.config.worse_tolerance, v.noise),
                v.demand,
                demand,
                self.config.demand_drop_tolerance,
            ),
            v.guard,
            guard,
            v.demand,
            demand,
            self.config.guard_tolerance,
            self.config.demand_drop_tolerance,
        )
        del self._verifying[v.action_id]
        # No value after a change (Prometheus answered, empty) is no evidence it helped: roll it
        # back. A Prometheus that did not answer leaves the change as it is.
        unproven = outcome == "no_data" and answer == []
        worse = outcome in ("worse", "worse_guard")
        roll_back = (worse or unproven) and v.reversible and v.plan.kind == "config"
        self.audit.append(
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
        episode = self._episodes.get(v.fingerprint)
        if roll_back:
            self._roll_back(v, after)
            if episode is not None:
                episode.planner += 1  # this knob made it worse: escalate to the rule's next planner
        if episode is not None:
            rule = self.rules.get(v.alert)
            if rule is not None and rule.kind == "config":
                self._next_step.add(v.fingerprint)  # a config knob can take another step
            elif not self._still_firing(episode.alert):
                self._end_episode(v.fingerprint, "resolved")

    def _roll_back(self, v: Verification, after: float | None) -> None:
        self.audit.append(
            "rollback", id=v.action_id, alert=v.alert, action=v.plan.action, old=v.plan.new, new=v.plan.old
        )
        try:
            self._admin.patch_config(v.plan.old)
        except Exception as exc:
            self.audit.append("rollback_failed", id=v.action_id, alert=v.alert, action=v.plan.action, error=str(exc))
            log.warning("rollback of %s failed: %s", v.plan.action, exc)
            return
        now = self._clock()
        self._track(v.plan.old, v.plan.new)
        self.rollbacks_total[v.plan.action] = self.rollbacks_total.get(v.plan.action, 0) + 1
        self.last_action_ts[v.plan.action] = now
        self.audit.append("rolled_back", id=v.action_id, alert=v.alert, action=v.plan.action, restored=v.plan.old)
        log.warning("rolled back %s: %s went from %s to %s", v.plan.action, v.query, v.baseline, after)

    def _restore(self, restore: Restore) -> None:
        del self._restores[restore.rule_action]
        values = {k: v for k, v in restore.values.items() if k in self._in_force}
        if not values:
            return
        action = "restore_fast" if set(values) == {"mode"} else f"restore_{restore.rule_action}"
        current = {k: self._in_force[k] for k in values}
        self.audit.append(
            "restore", alert=restore.alert, action=action, rule_action=restore.rule_action, old=current, new=values
        )
        try:
            self._apply_values(values)
        except Exception as exc:
            self.audit.append("restore_failed", alert=restore.alert, action=action, error=str(exc))
            self._count(restore.alert, action, "failed")
            log.warning("restoring %s failed: %s", values, exc)
            return
        self._track(values, current)
        self.last_action_ts[action] = self._clock()
        self._count(restore.alert, action, "applied")
        self.audit.append(
            "restored", alert=restore.alert, action=action, rule_action=restore.rule_action, restored=values
        )
        log.info("restored %s after %s stayed resolved", values, restore.alert)

    # -- a fresh engine --

    def on_engine_ready(self, generation: int) -> None:
        """Called by the supervisor when a newly started engine answers ready: its config is
        the command line's again, so what the policy has in force is applied once more. If
        the engine refuses, the policy records that its changes were reverted and forgets them."""
        with self._lock:
            if self.engine is None or not self._in_force or self.config.dry_run:
                return
            try:
                config = self.engine.get_config()
            except EngineError as exc:
                log.warning("engine %d ready, but reading its config failed: %s", generation, exc)
                return
            missing = {k: v for k, v in self._in_force.items() if config.get(k) != v}
            if not missing:
                return
            engine_values = {k: config.get(k) for k in missing}
            self.audit.append("reapply", generation=generation, old=engine_values, new=missing)  # the intent first
            try:
                self._apply_values(missing)
            except Exception as exc:
                self.audit.append("reverted", generation=generation, values=engine_values, lost=missing, error=str(exc))
                for name in missing:
                    self._in_force.pop(name, None)
                    self._original.pop(name, None)
                self._count("engine_restart", "reapply", "failed")
                log.warning("engine restart reverted %s and re-applying failed: %s", missing, exc)
                return
            self.reapplied_total += 1
            self.last_action_ts["reapply"] = self._clock()
            self._count("engine_restart", "reapply", "applied")
            self.audit.append("reapplied", generation=generation, old=engine_values, new=missing)
            log.info("engine %d came back with %s; re-applied %s", generation, engine_values, missing)

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

    @property
    def verifying(self) -> list[str]:
        with self._lock:
            return sorted(self._verifying)

    @property
    def deferred(self) -> list[str]:
        with self._lock:
            return list(self._deferred)

    @property
    def episodes(self) -> list[str]:
        with self._lock:
            return sorted(self._episodes)

    @property
    def in_force(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._in_force)

    @property
    def restore_due(self) -> float | None:
        with self._lock:
            return min((r.due for r in self._restores.values() if r.due is not None), default=None)

    # -- restart: rebuild the state from the audit log --

    def _reload(self, records: list[dict[str, Any]]) -> None:
        alerts: dict[str, Alert] = {}
        for r in records:
            event = r["event"]
            fingerprint = r.get("fingerprint", "")
            if event == "alert":
                self._seen.add(f"{r.get('fingerprint')}|{r.get('starts_at')}|{r.get('status')}")
                if r.get("status") == "firing":
                    alert = Alert(
                        "firing",
                        r.get("labels") or {"alertname": r.get("alert", "")},
                        {"description": r.get("description") or ""},
                        r.get("starts_at", ""),
                        fingerprint,
                    )
                    alerts[fingerprint] = self._firing[fingerprint] = alert
                else:
                    self._firing.pop(fingerprint, None)
                    self._deferred.pop(fingerprint, None)
            elif event == "decision":
                result = r.get("result")
                if result in ("skipped_verifying", "skipped_cooldown") and fingerprint in alerts:
                    self._deferred[fingerprint] = alerts[fingerprint]
                else:
                    self._deferred.pop(fingerprint, None)
                if result != "apply":
                    self._count(r.get("alert", ""), r.get("action", ""), result or "")
                if result == "dry_run":
                    self._last_applied[r.get("rule_action", "")] = r["ts"]
            elif event == "failed":
                self._count(r.get("alert", ""), r.get("action", ""), "failed")
            elif event == "applied":
                self._reload_applied(r, alerts)
            elif event == "verified":
                v = self._verifying.pop(r.get("id", ""), None)
                if v is not None and v.fingerprint in self._episodes and v.plan.kind == "config":
                    self._next_step.add(v.fingerprint)
                    if r.get("decision") == "rolled_back":
                        self._episodes[v.fingerprint].planner += 1
            elif event == "rolled_back":
                self.rollbacks_total[r["action"]] = self.rollbacks_total.get(r["action"], 0) + 1
                self.last_action_ts[r["action"]] = r["ts"]
                self._track(r.get("restored") or {}, {})
            elif event == "episode_ended":
                self._episodes.pop(fingerprint, None)
                self._next_step.discard(fingerprint)
                restore = r.get("restore")
                if restore and r.get("rule_action"):
                    due = restore.get("due")
                    self._restores[r["rule_action"]] = Restore(
                        r["rule_action"], r.get("alert", ""), restore["values"], None if due is None else float(due)
                    )
            elif event == "restored":
                self._restores.pop(r.get("rule_action", ""), None)
                self._track(r.get("restored") or {}, {})
                self.last_action_ts[r.get("action", "")] = r["ts"]
                self._count(r.get("alert", ""), r.get("action", ""), "applied")
            elif event == "reapplied":
                self.reapplied_total += 1
                self._count("engine_restart", "reapply", "applied")
            elif event == "reverted":
                for name in r.get("lost") or {}:
                    self._in_force.pop(name, None)
                    self._original.pop(name, None)
        if records:
            log.info(
                "remediation state reloaded from %s: %d records, %d verification(s) resumed, %s in force",
                self.audit.path,
                len(records),
                len(self._verifying),
                self._in_force or "nothing",
            )

    def _reload_applied(self, r: dict[str, Any], alerts: dict[str, Alert]) -> None:
        action, rule_action = r.get("action", ""), r.get("rule_action", "")
        fingerprint = r.get("fingerprint", "")
        self._count(r.get("alert", ""), action, "applied")
        self._last_applied[rule_action] = r["ts"]
        self.last_action_ts[action] = r["ts"]
        kind = r.get("kind", "config")
        if kind in ("config", "mode"):
            self._track(r.get("new") or {}, r.get("old") or {})
        record = r.get("episode")
        if record and fingerprint in alerts:
            self._episodes[fingerprint] = Episode(
                alerts[fingerprint],
                r["ts"],
                int(record.get("steps", 1)),
                int(record.get("planner", 0)),
                dict(record.get("changed") or {}),
            )
        verify = r.get("verify")
        if verify:
            plan = Plan(action, kind, r.get("new") or {}, r.get("old") or {})
            self._verifying[r["id"]] = Verification(
                r["id"],
                r.get("alert", ""),
                rule_action,
                plan,
                verify["query"],
                verify.get("baseline"),
                float(verify["deadline"]),
                verify.get("better", "lower"),
                bool(verify.get("reversible", True)),
                fingerprint,
                verify.get("demand"),
                verify.get("noise"),
                verify.get("guard"),
            )


class RemediationCollector:
    """The inferd_remediation_* families, for the agent's CollectorSet. Every rule has its
    applied series from the start (at 0), so rates and absence alerts work before the
    first decision."""

    name = "remediation"

    def __init__(self, policy: RemediationPolicy):
        self.policy = policy

    def collect(self):
        policy = self.policy
        actions = CounterMetricFamily(
            "inferd_remediation_actions",
            "Remediation changes by alert, action and result "
            "(applied, dry_run, failed); restores and re-applies after an engine restart too",
            labels=["alert", "action", "result"],
        )
        skipped = CounterMetricFamily(
            "inferd_remediation_skipped",
            "Alerts the policy did not act on, by reason "
            "(skipped_cooldown, skipped_verifying, at_limit, unsupported, no_data)",
            labels=["alert", "reason"],
        )
        rollbacks = CounterMetricFamily(
            "inferd_remediation_rollbacks",
            "Actions rolled back because verification saw the target worsen",
            labels=["action"],
        )
        last = GaugeMetricFamily(
            "inferd_remediation_last_action_timestamp_seconds",
            "Unix time of the last applied change of each action",
            labels=["action"],
        )
        episodes = GaugeMetricFamily("inferd_remediation_episodes", "Alerts being remediated now (one episode each)")
        in_force = GaugeMetricFamily(
            "inferd_remediation_in_force", "Engine settings the agent changed that are in force now", labels=["param"]
        )
        # Copies, not the policy's lock: a scrape must not wait for an engine call.
        counts = dict(policy.actions_total)
        for rule in policy.rules.values():
            counts.setdefault((rule.alert, rule.action, "applied"), 0)
        for (alert, action, result), count in sorted(counts.items()):
            actions.add_metric([alert, action, result], count)
        for (alert, reason), count in sorted(dict(policy.skipped_total).items()):
            skipped.add_metric([alert, reason], count)
        for action, count in sorted(dict(policy.rollbacks_total).items()):
            rollbacks.add_metric([action], count)
        for action, ts in sorted(dict(policy.last_action_ts).items()):
            last.add_metric([action], ts)
        episodes.add_metric([], len(policy._episodes))
        for param in sorted(dict(policy._in_force)):
            in_force.add_metric([param], 1)
        yield actions
        yield skipped
        yield rollbacks
        yield last
        yield episodes
        yield in_force
