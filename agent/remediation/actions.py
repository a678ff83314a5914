"""Planners and actions: a rule's next step planned from the engine's config (within the
policy's bounds, narrowed to the engine's), and plans carried out on the engine's admin
API or by its supervisor.

A plan is refused (a `Refusal`: the decision's action, result and detail) when nothing can
carry it out, the episode has taken its steps, the engine's config cannot be read, or every
planner from the episode's current one on is at its bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from inferd.agent.engine_client import EngineError
from inferd.agent.remediation_rules import Facts, Plan, PolicyConfig, Rule

from .engine_bounds import EngineBounds
from .readings import Readings

if TYPE_CHECKING:
    from .alerts import Alert
    from .episodes import Episode


class EngineHost(Protocol):
    """What the agent's supervisor offers the policy (both return a line for the log)."""

    def restart_engine(self) -> str: ...

    def rebind_engine(self) -> str: ...


class EngineAdmin(Protocol):
    bounds: dict[str, tuple[int, int]]  # what the engine accepts, from its last answer (EngineClient)

    def get_config(self) -> dict[str, Any]: ...

    def patch_config(self, changes: dict[str, Any]) -> dict[str, Any]: ...

    def set_mode(self, mode: str) -> dict[str, Any]: ...


@dataclass(slots=True, frozen=True)
class Refusal:
    """Why a rule takes no step now."""

    action: str
    result: str  # unsupported | at_limit | failed
    detail: str


class Actions:
    def __init__(self, engine: EngineAdmin | None, host: EngineHost | None, config: PolicyConfig, readings: Readings):
        self.engine = engine
        self.host = host
        self._config = config
        self._readings = readings
        self._engine_bounds = EngineBounds(config)

    def plan(self, alert: Alert, rule: Rule, episode: Episode | None) -> Plan | Refusal:
        if rule.kind == "restart":
            return self._host_plan("restart_engine", Plan("restart_engine", "restart", {}, {}))
        if rule.kind == "rebind":
            return self._host_plan("rebind_engine", Plan("rebind_numa", "rebind", {}, {}))
        if self.engine is None:
            return Refusal(rule.action, "unsupported", "no engine admin API configured")
        if episode is not None and episode.steps >= self._config.max_episode_steps:
            return Refusal(
                rule.action,
                "at_limit",
                f"{episode.steps} steps taken, max_episode_steps {self._config.max_episode_steps}",
            )
        try:
            config = self.engine.get_config()
            policy = self._engine_bounds.policy_for(self.engine.bounds)
            facts = self._readings.facts(alert, rule) if rule.uses_facts else Facts()
            reasons = []
            for index in range(episode.planner if episode else 0, len(rule.planners)):
                plan = rule.planners[index](config, policy, facts)
                if isinstance(plan, Plan):
                    if episode is not None:
                        episode.planner = index
                    return plan
                reasons.append(plan)
        except (EngineError, KeyError, ValueError, TypeError) as exc:
            return Refusal(rule.action, "failed", f"reading the engine's config: {exc}")
        return Refusal(rule.action, "at_limit", "; ".join(reasons) or "no planner left")

    def _host_plan(self, method: str, plan: Plan) -> Plan | Refusal:
        if self.host is None or not hasattr(self.host, method):
            return Refusal(plan.action, "unsupported", f"no supervisor offering {method}")
        return plan

    @property
    def _admin(self) -> EngineAdmin:
        """The engine's admin API: there is one wherever an engine setting changes (plan
        makes no config or mode plan without it, and only applied plans are verified,
        rolled back or restored)."""
        assert self.engine is not None
        return self.engine

    @property
    def _supervisor(self) -> EngineHost:
        """The engine's supervisor: _host_plan makes restart and rebind plans only with one."""
        assert self.host is not None
        return self.host

    def execute(self, plan: Plan) -> str | None:
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

    def roll_back(self, plan: Plan) -> None:
        self._admin.patch_config(plan.old)

    def apply_values(self, values: dict[str, Any]) -> None:
        """Engine settings, the mode included, through the admin API."""
        tunables = {k: v for k, v in values.items() if k != "mode"}
        if tunables:
            self._admin.patch_config(tunables)
        if "mode" in values:
            self._admin.set_mode(values["mode"])
