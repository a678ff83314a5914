"""Remediation policy: what the agent does when an alert reaches its webhook.

One alert instance (fingerprint + start time) gives at most one action. For each
alert the policy has a `Rule`: a planner that turns the engine's current tunables
into a bounded change (`Plan`), the PromQL target it watches afterwards and whether
lower or higher is better. The flow for a firing alert:

    duplicate?  -> ignored (idempotent on fingerprint + startsAt + status)
    no rule?    -> ignored, with a log line
    a change of the same kind still being verified?  -> skipped_verifying  } deferred: acted on
    cooldown of this rule not over?                  -> skipped_cooldown   } once clear, if still firing
    plan from the engine's config; nothing left within bounds -> at_limit
    --dry-run   -> dry_run (recorded, engine untouched)
    audit "decision" (fsynced)  ->  engine change  ->  audit "applied" / "failed"
    after verify_window_s: query the target again; worse by more than
    worse_tolerance -> audit "rollback", restore the old values, audit "rolled_back"

The fast-path rule is special: the engine is put in `fallback`, and once Alertmanager
reports the alert resolved and restore_after_s passes without a new firing, the
policy switches it back to `fast`. State (cooldowns, de-duplication keys, running
verifications, deferred alerts, a pending restore) is rebuilt from the audit log on start.
"""
from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import httpx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from agent.audit import AuditLog
from agent.engine_client import EngineError
from agent.remediation_rules import DEFAULT_RULES, Bounds, Plan, PolicyConfig, Rule, judge  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

RESULTS = ("applied", "dry_run", "failed", "skipped_cooldown", "skipped_verifying", "at_limit", "unsupported")


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


class PrometheusQuery:
    """Instant queries against Prometheus' HTTP API; the largest sample, None if empty."""

    def __init__(self, base_url: str, timeout_s: float = 5.0):
        self._http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s)

    def value(self, query: str) -> float | None:
        try:
            response = self._http.get("/api/v1/query", params={"query": query})
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("prometheus query %r failed: %s", query, exc)
            return None
        if body.get("status") != "success":
            log.warning("prometheus query %r: %s", query, body.get("error"))
            return None
        result = body.get("data", {}).get("result", [])
        values = [float(sample["value"][1]) for sample in result if "value" in sample]
        values = [v for v in values if math.isfinite(v)]
        return max(values) if values else None


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

    def to_record(self) -> dict[str, Any]:
        return {"query": self.query, "baseline": self.baseline, "deadline": round(self.deadline, 3),
                "better": self.better, "reversible": self.reversible}


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
        self._fallback_owner: str | None = None
        self._restore_due: float | None = None
        self.actions_total: dict[tuple[str, str, str], int] = {}
        self.rollbacks_total: dict[str, int] = {}
        self.last_action_ts: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reload(audit.read())

    # -- the webhook's entry point --

    def handle(self, alert: Alert) -> dict[str, Any]:
        with self._lock:
            if alert.key in self._seen:
                log.info("alert %s %s (fingerprint %s, starts %s) already handled; ignored",
                         alert.name, alert.status, alert.fingerprint, alert.starts_at)
                return {"alert": alert.name, "status": alert.status, "result": "duplicate"}
            self._seen.add(alert.key)
            rule = self.rules.get(alert.name)
            self.audit.append("alert", alert=alert.name, status=alert.status, fingerprint=alert.fingerprint,
                              starts_at=alert.starts_at, labels=alert.labels,
                              description=alert.annotations.get("description"))
            if rule is None:
                log.info("no remediation rule for alert %r (%s); ignored", alert.name, alert.status)
                return {"alert": alert.name, "status": alert.status, "result": "ignored"}
            if alert.status == "resolved":
                self._deferred.pop(alert.fingerprint, None)
                return self._on_resolved(alert, rule)
            if rule.restores_fast:
                self._restore_due = None  # a new firing cancels a pending restore
            return self._act(alert, rule)

    # -- decisions --

    def _blocker(self, rule: Rule, now: float) -> tuple[str, str] | None:
        """Why this rule may not act now (result, detail), or None."""
        busy = [v for v in self._verifying.values()
                if v.rule_action == rule.action or (rule.kind == "config" and v.plan.kind == "config")]
        if busy:
            return "skipped_verifying", f"{busy[0].plan.action} (id {busy[0].action_id}) is being verified"
        last = self._last_applied.get(rule.action)
        if last is not None and now - last < self.config.cooldown_s:
            return "skipped_cooldown", f"last {rule.action} {now - last:.0f}s ago, cooldown {self.config.cooldown_s:g}s"
        return None

    def _act(self, alert: Alert, rule: Rule) -> dict[str, Any]:
        now = self._clock()
        blocker = self._blocker(rule, now)
        if blocker is not None:
            # Not dropped: Alertmanager will not send this incident again, so it waits
            # (while it keeps firing) until the blocker clears; see tick().
            self._deferred[alert.fingerprint] = alert
            result, detail = blocker
            return self._decide(alert, rule, rule.action, result, detail=f"{detail}; deferred while it fires")
        plan = self._plan(alert, rule)
        if isinstance(plan, dict):
            return plan
        query = self._target_query(rule, alert)
        baseline = self.metrics.value(query) if (query and self.metrics) else None
        if self.config.dry_run:
            self._last_applied[rule.action] = now
            return self._decide(alert, rule, plan.action, "dry_run", old=plan.old, new=plan.new, baseline=baseline)

        action_id = uuid.uuid4().hex[:12]
        self.audit.append("decision", id=action_id, alert=alert.name, fingerprint=alert.fingerprint,
                          action=plan.action, rule_action=rule.action, kind=plan.kind, old=plan.old, new=plan.new,
                          baseline=baseline, result="apply")
        try:
            detail = self._execute(plan)
        except Exception as exc:  # the engine or the supervisor refused; record, do not crash the webhook
            self.audit.append("failed", id=action_id, alert=alert.name, action=plan.action, error=str(exc))
            self._count(alert.name, plan.action, "failed")
            log.warning("remediation %s for %s failed: %s", plan.action, alert.name, exc)
            return {"alert": alert.name, "status": alert.status, "action": plan.action, "result": "failed", "error": str(exc)}

        self._last_applied[rule.action] = now
        self.last_action_ts[plan.action] = now
        self._count(alert.name, plan.action, "applied")
        verification = None
        if query and self.metrics:
            verification = Verification(action_id, alert.name, rule.action, plan, query, baseline,
                                        now + self.config.verify_window_s, rule.better, rule.reversible)
            self._verifying[action_id] = verification
        if rule.restores_fast:
            self._fallback_owner = action_id
        self.audit.append("applied", id=action_id, alert=alert.name, action=plan.action, rule_action=rule.action,
                          kind=plan.kind, old=plan.old, new=plan.new, detail=detail,
                          verify=verification.to_record() if verification else None)
        log.info("remediation %s for %s applied: %s -> %s", plan.action, alert.name, plan.old, plan.new)
        return {"alert": alert.name, "status": alert.status, "action": plan.action, "result": "applied",
                "id": action_id, "old": plan.old, "new": plan.new}

    def _plan(self, alert: Alert, rule: Rule) -> Plan | dict[str, Any]:
        if rule.kind == "restart":
            return self._host_plan(alert, rule, "restart_engine", Plan("restart_engine", "restart", {}, {}))
        if rule.kind == "rebind":
            return self._host_plan(alert, rule, "rebind_engine", Plan("rebind_numa", "rebind", {}, {}))
        if self.engine is None:
            return self._decide(alert, rule, rule.action, "unsupported", detail="no engine admin API configured")
        try:
            config = self.engine.get_config()
            plan = rule.planner(config, self.config)
        except (EngineError, KeyError, ValueError, TypeError) as exc:
            return self._decide(alert, rule, rule.action, "failed", detail=f"reading the engine's config: {exc}")
        if isinstance(plan, str):
            return self._decide(alert, rule, rule.action, "at_limit", detail=plan)
        return plan

    def _host_plan(self, alert: Alert, rule: Rule, method: str, plan: Plan) -> Plan | dict[str, Any]:
        if self.host is None or not hasattr(self.host, method):
            return self._decide(alert, rule, plan.action, "unsupported", detail=f"no supervisor offering {method}")
        return plan

    def _execute(self, plan: Plan) -> str | None:
        if plan.kind == "config":
            return f"engine config now {self.engine.patch_config(plan.new)}"
        if plan.kind == "mode":
            self.engine.set_mode(plan.new["mode"])
            return None
        if plan.kind == "restart":
            return self.host.restart_engine()
        if plan.kind == "rebind":
            return self.host.rebind_engine()
        raise ValueError(f"unknown plan kind {plan.kind!r}")

    def _decide(self, alert: Alert, rule: Rule, action: str, result: str, **extra: Any) -> dict[str, Any]:
        self.audit.append("decision", alert=alert.name, fingerprint=alert.fingerprint, action=action,
                          rule_action=rule.action, result=result, **extra)
        self._count(alert.name, action, result)
        log.info("remediation for %s: %s %s %s", alert.name, action, result, extra.get("detail", ""))
        return {"alert": alert.name, "status": alert.status, "action": action, "result": result, **extra}

    def _on_resolved(self, alert: Alert, rule: Rule) -> dict[str, Any]:
        if rule.restores_fast and self._fallback_owner is not None:
            self._restore_due = self._clock() + self.config.restore_after_s
            return {"alert": alert.name, "status": "resolved", "result": "restore_scheduled",
                    "restore_in_s": self.config.restore_after_s}
        return {"alert": alert.name, "status": "resolved", "result": "noted"}

    def _target_query(self, rule: Rule, alert: Alert) -> str | None:
        if not rule.target:
            return None
        sel = ",".join(f'{k}="{alert.labels[k]}"' for k in ("job", "instance") if alert.labels.get(k))
        sel = sel or self.config.engine_selector  # an empty selector is not valid PromQL
        window = f"{max(1, round(self.config.verify_window_s))}s"
        return rule.target.format(sel=sel, engine=self.config.engine_selector, window=window)

    def _count(self, alert: str, action: str, result: str) -> None:
        key = (alert, action, result)
        self.actions_total[key] = self.actions_total.get(key, 0) + 1

    # -- the clock: verifications and the way back to fast --

    def tick(self) -> None:
        with self._lock:
            now = self._clock()
            for verification in [v for v in self._verifying.values() if now >= v.deadline]:
                self._verify(verification)
            if self._restore_due is not None and now >= self._restore_due:
                self._restore_fast()
            for fingerprint, alert in list(self._deferred.items()):
                rule = self.rules.get(alert.name)
                if rule is None or self._blocker(rule, self._clock()) is None:
                    del self._deferred[fingerprint]
                    if rule is not None:
                        log.info("acting on deferred alert %s (fingerprint %s)", alert.name, fingerprint)
                        self._act(alert, rule)

    def _verify(self, v: Verification) -> None:
        after = self.metrics.value(v.query) if self.metrics else None
        outcome = judge(v.baseline, after, v.better, self.config.worse_tolerance)
        del self._verifying[v.action_id]
        self.audit.append("verified", id=v.action_id, alert=v.alert, action=v.plan.action, query=v.query,
                          baseline=v.baseline, after=after, outcome=outcome)
        log.info("verification of %s (%s): %s -> %s, %s", v.plan.action, v.action_id, v.baseline, after, outcome)
        if outcome != "worse" or not v.reversible or v.plan.kind != "config":
            return
        self.audit.append("rollback", id=v.action_id, alert=v.alert, action=v.plan.action, old=v.plan.new, new=v.plan.old)
        try:
            self.engine.patch_config(v.plan.old)
        except Exception as exc:
            self.audit.append("rollback_failed", id=v.action_id, alert=v.alert, action=v.plan.action, error=str(exc))
            log.warning("rollback of %s failed: %s", v.plan.action, exc)
            return
        now = self._clock()
        self.rollbacks_total[v.plan.action] = self.rollbacks_total.get(v.plan.action, 0) + 1
        self.last_action_ts[v.plan.action] = now
        self.audit.append("rolled_back", id=v.action_id, alert=v.alert, action=v.plan.action, restored=v.plan.old)
        log.warning("rolled back %s: %s got worse (%s -> %s)", v.plan.action, v.query, v.baseline, after)

    def _restore_fast(self) -> None:
        owner, self._restore_due = self._fallback_owner, None
        self.audit.append("restore", id=owner, alert="InferdEngineFastPathFailing", action="restore_fast",
                          old={"mode": "fallback"}, new={"mode": "fast"})
        try:
            self.engine.set_mode("fast")
        except Exception as exc:
            self.audit.append("restore_failed", id=owner, action="restore_fast", error=str(exc))
            self._count("InferdEngineFastPathFailing", "restore_fast", "failed")
            log.warning("switching the engine back to fast failed: %s", exc)
            return
        self._fallback_owner = None
        self.last_action_ts["restore_fast"] = self._clock()
        self._count("InferdEngineFastPathFailing", "restore_fast", "applied")
        self.audit.append("restored", id=owner, alert="InferdEngineFastPathFailing", action="restore_fast", mode="fast")
        log.info("engine switched back to the fast path")

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
    def restore_due(self) -> float | None:
        return self._restore_due

    # -- restart: rebuild the state from the audit log --

    def _reload(self, records: list[dict[str, Any]]) -> None:
        alerts: dict[str, Alert] = {}
        for r in records:
            event = r["event"]
            fingerprint = r.get("fingerprint", "")
            if event == "decision":
                if r.get("result") in ("skipped_verifying", "skipped_cooldown") and fingerprint in alerts:
                    self._deferred[fingerprint] = alerts[fingerprint]
                else:
                    self._deferred.pop(fingerprint, None)
            if event == "alert":
                self._seen.add(f"{r.get('fingerprint')}|{r.get('starts_at')}|{r.get('status')}")
                if r.get("status") == "firing":
                    alerts[fingerprint] = Alert("firing", r.get("labels") or {"alertname": r.get("alert", "")},
                                                {"description": r.get("description") or ""}, r.get("starts_at", ""),
                                                fingerprint)
                else:
                    self._deferred.pop(fingerprint, None)
                rule = self.rules.get(r.get("alert", ""))
                if rule is not None and rule.restores_fast:
                    if r.get("status") == "resolved" and self._fallback_owner is not None:
                        self._restore_due = r["ts"] + self.config.restore_after_s
                    elif r.get("status") == "firing":
                        self._restore_due = None
            elif event == "decision" and r.get("result") != "apply":
                self._count(r.get("alert", ""), r.get("action", ""), r.get("result", ""))
                if r.get("result") == "dry_run":
                    self._last_applied[r.get("rule_action", "")] = r["ts"]
            elif event == "failed":
                self._count(r.get("alert", ""), r.get("action", ""), "failed")
            elif event == "applied":
                self._reload_applied(r)
            elif event == "verified":
                self._verifying.pop(r.get("id", ""), None)
            elif event == "rolled_back":
                self.rollbacks_total[r["action"]] = self.rollbacks_total.get(r["action"], 0) + 1
                self.last_action_ts[r["action"]] = r["ts"]
            elif event == "restored":
                self._fallback_owner, self._restore_due = None, None
                self.last_action_ts["restore_fast"] = r["ts"]
                self._count("InferdEngineFastPathFailing", "restore_fast", "applied")
        if records:
            log.info("remediation state reloaded from %s: %d records, %d verification(s) resumed",
                     self.audit.path, len(records), len(self._verifying))

    def _reload_applied(self, r: dict[str, Any]) -> None:
        action, rule_action = r.get("action", ""), r.get("rule_action", "")
        self._count(r.get("alert", ""), action, "applied")
        self._last_applied[rule_action] = r["ts"]
        self.last_action_ts[action] = r["ts"]
        rule = self.rules.get(r.get("alert", ""))
        if rule is not None and rule.restores_fast:
            self._fallback_owner = r.get("id")
        verify = r.get("verify")
        if verify:
            plan = Plan(action, r.get("kind", "config"), r.get("new") or {}, r.get("old") or {})
            self._verifying[r["id"]] = Verification(
                r["id"], r.get("alert", ""), rule_action, plan, verify["query"], verify.get("baseline"),
                float(verify["deadline"]), verify.get("better", "lower"), bool(verify.get("reversible", True)))


class RemediationCollector:
    """The inferd_remediation_* families, for the agent's CollectorSet."""

    name = "remediation"

    def __init__(self, policy: RemediationPolicy):
        self.policy = policy

    def collect(self):
        actions = CounterMetricFamily("inferd_remediation_actions", "Remediation decisions by alert, action and result",
                                      labels=["alert", "action", "result"])
        rollbacks = CounterMetricFamily("inferd_remediation_rollbacks", "Actions rolled back because verification saw the target worsen",
                                        labels=["action"])
        last = GaugeMetricFamily("inferd_remediation_last_action_timestamp_seconds",
                                 "Unix time of the last applied change of each action", labels=["action"])
        # Copies, not the policy's lock: a scrape must not wait for an engine call.
        for (alert, action, result), count in sorted(dict(self.policy.actions_total).items()):
            actions.add_metric([alert, action, result], count)
        for action, count in sorted(dict(self.policy.rollbacks_total).items()):
            rollbacks.add_metric([action], count)
        for action, ts in sorted(dict(self.policy.last_action_ts).items()):
            last.add_metric([action], ts)
        yield actions
        yield rollbacks
        yield last
