"""The remediation policy's metrics: its counts, running episodes and settings in force.

The collector reads the policy's counters, `_episodes` and `_in_force`; NodeRemediation
(agent.kubernetes) offers the same names summed over its pods' policies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from .policy import RemediationPolicy


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
