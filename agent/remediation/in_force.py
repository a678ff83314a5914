"""What the policy believes is in force on the engine: its changes not rolled back or
restored, each with the engine's own value from before the policy's first change.

A freshly started engine runs its command line's config again; `reapply` puts the policy's
values back, or records that they were reverted and forgets them when the engine refuses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from inferd.agent.audit import AuditLog

from .actions import Actions
from .counters import Counters

log = logging.getLogger(__name__)


class InForce:
    def __init__(self, audit: AuditLog, clock: Callable[[], float], counters: Counters, actions: Actions):
        self._audit = audit
        self._clock = clock
        self._counters = counters
        self._actions = actions
        self.values: dict[str, Any] = {}  # engine setting -> the value the policy set
        self._original: dict[str, Any] = {}  # engine setting -> its value before the policy's first change

    def track(self, new: dict[str, Any], old: dict[str, Any]) -> None:
        """Keep what is in force: the policy's values that differ from the engine's own."""
        for name, value in new.items():
            self._original.setdefault(name, old.get(name))
            if value == self._original[name]:
                self.values.pop(name, None)
                self._original.pop(name, None)
            else:
                self.values[name] = value

    def forget(self, names: Iterable[str]) -> None:
        for name in names:
            self.values.pop(name, None)
            self._original.pop(name, None)

    def reapply(self, engine_config: dict[str, Any], generation: int) -> None:
        """Put back what the engine `generation`, just started with `engine_config`, lacks."""
        missing = {k: v for k, v in self.values.items() if engine_config.get(k) != v}
        if not missing:
            return
        engine_values = {k: engine_config.get(k) for k in missing}
        self._audit.append("reapply", generation=generation, old=engine_values, new=missing)  # the intent first
        try:
            self._actions.apply_values(missing)
        except Exception as exc:
            self._audit.append("reverted", generation=generation, values=engine_values, lost=missing, error=str(exc))
            self.forget(missing)
            self._counters.count("engine_restart", "reapply", "failed")
            log.warning("engine restart reverted %s and re-applying failed: %s", missing, exc)
            return
        self._counters.reapplied()
        self._counters.changed("reapply", self._clock())
        self._audit.append("reapplied", generation=generation, old=engine_values, new=missing)
        log.info("engine %d came back with %s; re-applied %s", generation, engine_values, missing)
