"""The remediation collector's registry entry: inferd_remediation_* from the policy.

`RemediationCollector` lives beside the policy it reads (agent.remediation). The policy
is made by agent.webhook's router hook, so this entry is built late, once it exists.
"""

from __future__ import annotations

from inferd.agent.remediation import RemediationCollector
from inferd.exporters.registry import BuildContext, Built, CollectorEntry


def build(context: BuildContext) -> Built | None:
    policy = context.extra.get("remediation")
    if policy is None:
        return None  # no webhook, no policy: nothing to report
    return Built(RemediationCollector(policy))


ENTRY = CollectorEntry(
    "remediation", "the remediation policy: actions, skips, rollbacks, settings in force", build, late=True
)
