"""The policy's state rebuilt from its audit log on start: what was handled and fires, the
counts, cooldowns, deferred alerts, running episodes, steps awaiting verification, pending
restores and what is in force. Each record is handed to the owners of what it changed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferd.agent.remediation_rules import Plan

from .alerts import Alert, AlertBook
from .counters import Counters
from .decisions import Decisions
from .episodes import Episode, EpisodeBook
from .in_force import InForce
from .restore import Restore, Restores
from .verification import Verification, Verifications


@dataclass(slots=True, frozen=True)
class PolicyState:
    """The owners of the policy's state."""

    alerts: AlertBook
    decisions: Decisions
    counters: Counters
    in_force: InForce
    episodes: EpisodeBook
    verifications: Verifications
    restores: Restores


def replay(state: PolicyState, records: list[dict[str, Any]]) -> None:
    alerts: dict[str, Alert] = {}  # fingerprint -> the last firing alert logged under it
    counters = state.counters
    for r in records:
        event = r["event"]
        fingerprint = r.get("fingerprint", "")
        if event == "alert":
            state.alerts.see(f"{r.get('fingerprint')}|{r.get('starts_at')}|{r.get('status')}")
            if r.get("status") == "firing":
                alert = Alert(
                    "firing",
                    r.get("labels") or {"alertname": r.get("alert", "")},
                    {"description": r.get("description") or ""},
                    r.get("starts_at", ""),
                    fingerprint,
                )
                alerts[fingerprint] = alert
                state.alerts.fires(alert)
            else:
                state.alerts.resolved(fingerprint)
                state.decisions.undefer(fingerprint)
        elif event == "decision":
            result = r.get("result")
            if result in ("skipped_verifying", "skipped_cooldown") and fingerprint in alerts:
                state.decisions.defer(alerts[fingerprint])
            else:
                state.decisions.undefer(fingerprint)
            if result != "apply":
                counters.count(r.get("alert", ""), r.get("action", ""), result or "")
            if result == "dry_run":
                state.decisions.applied(r.get("rule_action", ""), r["ts"])
        elif event == "failed":
            counters.count(r.get("alert", ""), r.get("action", ""), "failed")
        elif event == "applied":
            _applied(state, r, alerts)
        elif event == "verified":
            v = state.verifications.pop(r.get("id", ""))
            if v is not None and v.fingerprint in state.episodes and v.plan.kind == "config":
                state.episodes.resume_verified(v.fingerprint, r.get("decision") == "rolled_back")
        elif event == "rolled_back":
            counters.rolled_back(r["action"], r["ts"])
            state.in_force.track(r.get("restored") or {}, {})
        elif event == "episode_ended":
            state.episodes.ended(fingerprint)
            restore = r.get("restore")
            if restore and r.get("rule_action"):
                due = restore.get("due")
                state.restores.put(
                    Restore(
                        r["rule_action"], r.get("alert", ""), restore["values"], None if due is None else float(due)
                    )
                )
        elif event == "restored":
            state.restores.done(r.get("rule_action", ""))
            state.in_force.track(r.get("restored") or {}, {})
            counters.changed(r.get("action", ""), r["ts"])
            counters.count(r.get("alert", ""), r.get("action", ""), "applied")
        elif event == "reapplied":
            counters.reapplied()
        elif event == "reverted":
            state.in_force.forget(r.get("lost") or {})


def _applied(state: PolicyState, r: dict[str, Any], alerts: dict[str, Alert]) -> None:
    action, rule_action = r.get("action", ""), r.get("rule_action", "")
    fingerprint = r.get("fingerprint", "")
    state.counters.count(r.get("alert", ""), action, "applied")
    state.decisions.applied(rule_action, r["ts"])
    state.counters.changed(action, r["ts"])
    kind = r.get("kind", "config")
    if kind in ("config", "mode"):
        state.in_force.track(r.get("new") or {}, r.get("old") or {})
    record = r.get("episode")
    if record and fingerprint in alerts:
        state.episodes.resume(
            Episode(
                alerts[fingerprint],
                r["ts"],
                int(record.get("steps", 1)),
                int(record.get("planner", 0)),
                dict(record.get("changed") or {}),
            )
        )
    verify = r.get("verify")
    if verify:
        plan = Plan(action, kind, r.get("new") or {}, r.get("old") or {})
        state.verifications.add(
            Verification(
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
        )
