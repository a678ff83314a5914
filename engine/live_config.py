"""The engine's configuration while it runs, and its one owner.

A run-time change (the admin API's PATCH /admin/config and POST /admin/mode reach
LLMEngine.reconfigure) or a fast-path failure replaces the configuration between steps.
Whatever reads a value that can change (the scheduler its budgets and preemption mode,
AsyncDecode whether to launch ahead, the runner its mode, the engine the cold-KV settings)
holds this object and reads `current` when it needs the value, so no reader keeps a copy
that a change would leave stale. A change is validated once, by building the new
EngineConfig (`plan`: EngineConfig.with_changes, against TUNABLE_BOUNDS and the rules
across fields), and takes effect at `commit`, after the engine has allocated what it
needs: a refused change leaves nothing changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config import EngineConfig


class LiveConfig:
    __slots__ = ("_current",)

    def __init__(self, config: EngineConfig) -> None:
        self._current = config

    @property
    def current(self) -> EngineConfig:
        return self._current

    def current_mode(self) -> str:
        """`current.mode`, for the runner: ModelRunner and TPRunner take a reader of the mode."""
        return self._current.mode

    def plan(self, changes: Mapping[str, Any]) -> EngineConfig:
        """The configuration `changes` would make (a TunableError names the field at fault);
        nothing takes effect until `commit`."""
        return self._current.with_changes(changes)

    def commit(self, config: EngineConfig) -> None:
        self._current = config
