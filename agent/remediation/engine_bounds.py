"""The policy's bounds narrowed to the engine's.

PolicyConfig's bounds are operator policy: where the agent may move a tunable, which may
be narrower than what the engine accepts but never wider. The engine publishes what it
accepts with every admin answer (GET /admin/config's `bounds`, kept by EngineClient); a
configured bound past it is clamped, with a log line, so no planner plans a value the
engine would refuse.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from inferd.agent.remediation_rules import Bounds, PolicyConfig

log = logging.getLogger(__name__)


def clamp(bounds: Bounds, low: int, high: int) -> Bounds:
    """`bounds` within [low, high]; a range wholly outside it shrinks to the nearer end."""
    return Bounds(min(max(bounds.minimum, low), high), max(min(bounds.maximum, high), low), bounds.max_step)


class EngineBounds:
    """The PolicyConfig the planners use against an engine with the given bounds."""

    def __init__(self, config: PolicyConfig):
        self._config = config
        self._engine: dict[str, tuple[int, int]] = {}
        self._clamped = config

    def policy_for(self, engine: dict[str, tuple[int, int]]) -> PolicyConfig:
        if engine == self._engine:
            return self._clamped
        changes: dict[str, Any] = {}  # PolicyConfig field -> its narrowed Bounds
        for field in dataclasses.fields(self._config):
            bounds = getattr(self._config, field.name)
            if not isinstance(bounds, Bounds) or field.name not in engine:
                continue
            low, high = engine[field.name]
            narrowed = clamp(bounds, low, high)
            if narrowed != bounds:
                log.warning(
                    "remediation bounds of %s [%d, %d] reach past the engine's [%d, %d]: clamped to [%d, %d]",
                    field.name,
                    bounds.minimum,
                    bounds.maximum,
                    low,
                    high,
                    narrowed.minimum,
                    narrowed.maximum,
                )
                changes[field.name] = narrowed
        self._engine = dict(engine)
        self._clamped = dataclasses.replace(self._config, **changes) if changes else self._config
        return self._clamped
