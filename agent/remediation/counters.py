"""The policy's counts, for the inferd_remediation_* families: changes by alert, action and
result, skips by reason, rollbacks, re-applies and the time of each action's last change.

Plain dicts that only grow: the collector copies them without the policy's lock, so a scrape
never waits for an engine call.
"""

from __future__ import annotations

ACTION_RESULTS = ("applied", "dry_run", "failed")
SKIP_RESULTS = ("skipped_cooldown", "skipped_verifying", "at_limit", "unsupported", "no_data")
RESULTS = ACTION_RESULTS + SKIP_RESULTS


class Counters:
    def __init__(self) -> None:
        self.actions_total: dict[tuple[str, str, str], int] = {}
        self.skipped_total: dict[tuple[str, str], int] = {}
        self.rollbacks_total: dict[str, int] = {}
        self.reapplied_total = 0
        self.last_action_ts: dict[str, float] = {}

    def count(self, alert: str, action: str, result: str) -> None:
        if result in SKIP_RESULTS:
            key2 = (alert, result)
            self.skipped_total[key2] = self.skipped_total.get(key2, 0) + 1
            return
        key = (alert, action, result)
        self.actions_total[key] = self.actions_total.get(key, 0) + 1

    def changed(self, action: str, ts: float) -> None:
        """An action changed the engine at `ts`."""
        self.last_action_ts[action] = ts

    def rolled_back(self, action: str, ts: float) -> None:
        self.rollbacks_total[action] = self.rollbacks_total.get(action, 0) + 1
        self.last_action_ts[action] = ts

    def reapplied(self) -> None:
        self.reapplied_total += 1
        self.count("engine_restart", "reapply", "applied")
