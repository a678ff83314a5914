"""Remediation: what the agent does when an alert reaches its webhook (agent.remediation.policy
tells the flow). The rules and their bounds are agent.remediation_rules.

    policy        RemediationPolicy: the webhook's entry point, one step, the clock
    alerts        Alert, and the book of handled and firing alerts
    decisions     whether a rule may act now (verifying, cooldown), deferred alerts
    episodes      the steps taken for one alert while it fires
    actions       planning a step from the engine's config, carrying it out
    verification  judging a step one window later, rolling it back
    restore       putting an episode's values back once its alert stays resolved
    in_force      what the policy has in force on the engine; re-applying it after a restart
    readings      the Prometheus queries: targets, demand, guard, facts, ALERTS
    counters      the counts the collector exports
    collector     the inferd_remediation_* families
    reload        the state rebuilt from the audit log
"""

from inferd.agent.remediation_rules import DEFAULT_RULES, Bounds, Facts, Plan, PolicyConfig, Rule, judge

from .alerts import Alert
from .collector import RemediationCollector
from .policy import RemediationPolicy

__all__ = [
    "DEFAULT_RULES",
    "Alert",
    "Bounds",
    "Facts",
    "Plan",
    "PolicyConfig",
    "RemediationCollector",
    "RemediationPolicy",
    "Rule",
    "judge",
]
