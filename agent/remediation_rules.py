"""The remediation rules: which bounded change answers which alert, and how to judge it.

`PolicyConfig` holds the bounds (minimum, maximum, maximum step) of every parameter the
agent moves, the cooldown between episodes, the verification window and the restore
delay. Each `Rule` names its alert, its action family (the cooldown key), its planners
in escalation order (each turns the engine's current tunables into a `Plan`, or a
reason why nothing is left within its bounds; the next planner is tried when one is at
its bound or its last step made things worse), and the PromQL target watched after a
change with the direction that counts as better. `judge` compares the target before
and after; `credit` refuses to call a change an improvement when the demand on the
engine fell by more than `demand_drop_tolerance` meanwhile.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferd.strict_fields import from_fields

# ---- configuration -------------------------------------------------------------------


@dataclass(slots=True)
class Bounds:
    """Where the agent may move an integer tunable, and by how much per action."""

    minimum: int
    maximum: int
    max_step: int

    def __post_init__(self) -> None:
        for name in ("minimum", "maximum", "max_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"bounds {name} must be an integer, got {value!r}")
        if self.minimum < 0 or self.minimum > self.maximum:
            raise ValueError(f"bounds need 0 <= minimum <= maximum, got [{self.minimum}, {self.maximum}]")
        if self.max_step < 1:
            raise ValueError(f"bounds max_step must be >= 1, got {self.max_step}")

    def step(self, value: int, fraction: float) -> int:
        return min(self.max_step, max(1, math.ceil(value * fraction)))

    def lower(self, value: int, fraction: float) -> int:
        value = min(value, self.maximum)
        return max(self.minimum, value - self.step(value, fraction))

    def higher(self, value: int, fraction: float) -> int:
        value = max(value, self.minimum)
        return min(self.maximum, value + self.step(value, fraction))

    def toward(self, value: int, target: int) -> int:
        """Up to target in one action, as far as max_step and the maximum allow."""
        value = max(value, self.minimum)
        return min(self.maximum, value + self.max_step, max(value, target))


@dataclass(slots=True)
class PolicyConfig:
    max_num_seqs: Bounds = field(default_factory=lambda: Bounds(4, 512, 16))
    max_num_batched_tokens: Bounds = field(default_factory=lambda: Bounds(256, 65536, 2048))
    step_fraction: float = 0.25
    """One step moves a parameter by this share of its value, at most max_step."""
    cooldown_s: float = 600.0
    """Least time between the last step of one episode of a rule and the start of the next
    (the steps of one episode follow each other one verification window apart)."""
    verify_window_s: float = 120.0
    """A step is judged this long after it; targets are measured over its second half
    (before the step, over as long), so the transition itself does not count."""
    worse_tolerance: float = 0.1
    """The target counts as worse when it moved the wrong way by more than this share."""
    max_episode_steps: int = 8
    """Most steps one episode takes while its alert keeps firing."""
    restore_after_s: float = 600.0
    """How long an alert must stay resolved before the values its episode changed (the
    fast path's fallback included) go back to what they were."""
    engine_selector: str = 'job="inferd-engine"'
    """PromQL matchers for the engine's series where the alert's labels do not name them."""
    demand_query: str = "sum(vllm:num_requests_running{{{engine}}}) + sum(vllm:num_requests_waiting{{{engine}}})"
    """The demand on the engine (requests running + waiting), read with each baseline and after."""
    demand_drop_tolerance: float = 0.25
    """An improvement seen while the demand fell by more than this share is not credited."""
    guard_query: str = "sum(rate(vllm:generation_tokens_total{{{engine}}}[{window}]))"
    """What a config step must not cost: the engine's output tokens/s, read with each baseline
    and after. A step that fixes its target by serving much less (max_num_seqs lowered to 1
    ends KV thrashing and most of the throughput) is rolled back. Empty: no guard."""
    guard_tolerance: float = 0.25
    """The guard counts as worse when it fell by more than this share while the demand did not
    fall by more than demand_drop_tolerance."""
    dry_run: bool = False

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, Bounds(**value))
            elif not isinstance(value, Bounds):
                raise ValueError(f"{name} must be bounds (minimum, maximum, max_step), got {value!r}")
        if not 0 < self.step_fraction <= 1:
            raise ValueError(f"step_fraction must be in (0, 1], got {self.step_fraction}")
        if (
            isinstance(self.max_episode_steps, bool)
            or not isinstance(self.max_episode_steps, int)
            or self.max_episode_steps < 1
        ):
            raise ValueError(f"max_episode_steps must be an integer >= 1, got {self.max_episode_steps!r}")
        for name in (
            "cooldown_s",
            "verify_window_s",
            "restore_after_s",
            "worse_tolerance",
            "demand_drop_tolerance",
            "guard_tolerance",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if self.verify_window_s <= 0:
            raise ValueError("verify_window_s must be > 0")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PolicyConfig:
        return from_fields(cls, values, "remediation setting")


@dataclass(slots=True, frozen=True)
class Plan:
    action: str
    kind: str  # config | mode | restart | rebind
    new: dict[str, Any]
    old: dict[str, Any]


# ---- the rules -----------------------------------------------------------------------

Planner = Callable[[dict[str, Any], PolicyConfig, "Facts"], "Plan | str"]


@dataclass(slots=True, frozen=True)
class Facts:
    """What Prometheus says about the engine when a step is planned (None: no answer)."""

    kv_usage: float | None = None  # vllm:kv_cache_usage_perc, 0..1
    waiting: float | None = None  # vllm:num_requests_waiting
    prompt_tokens: float | None = None  # mean prompt length of the requests finished lately
    running: float | None = None  # vllm:num_requests_running
    preemptions_per_s: float | None = None  # rate of vllm:num_preemptions_total
    swap_time_share: float | None = None  # rate of inferd_kv_swap_seconds_total: share of wall time in swaps

    @property
    def swap_bound(self) -> bool:
        """Steps stall on KV swap copies (InferdKVSwapBound's condition)."""
        return (self.swap_time_share or 0.0) > SWAP_BOUND_SHARE

    @property
    def kv_bound(self) -> bool:
        """Requests queue because the KV cache is full, not for compute."""
        return (self.kv_usage or 0.0) >= KV_BOUND_USAGE and (self.waiting or 0.0) > 0

    def seats_full(self, max_num_seqs: int) -> bool:
        """Requests wait because every seat is taken, and the KV cache has room: not full and
        nothing preempted lately (a thrashing pool dips below full between preemptions, and
        more seats would make it thrash harder)."""
        return (
            (self.waiting or 0.0) > 0
            and (self.running or 0.0) >= max_num_seqs
            and not self.kv_bound
            and not (self.preemptions_per_s or 0.0) > 0
        )


KV_BOUND_USAGE = 0.9
SWAP_BOUND_SHARE = 0.1
"""alerts/params.yml kv_swap_time_share: above it the engine is swap-bound."""
PREFILL_CHUNK_QUANTUM = 256
"""A prefill chunk sized from prompt lengths is rounded up to a multiple of this."""


@dataclass(slots=True, frozen=True)
class Rule:
    alert: str
    action: str
    """Name of the action family: the cooldown key and the metric label before planning."""
    kind: str  # config | mode | restart | rebind
    planners: tuple[Planner, ...] = ()
    """In escalation order; config and mode rules only."""
    target: str | None = None
    """PromQL; {sel} is the alert's job/instance matchers, {engine} the engine's, {window} the window."""
    better: str = "lower"
    reversible: bool = True
    """A config step whose verification says worse (or has no data) is rolled back."""
    uses_facts: bool = False
    """Its planners read Facts (extra Prometheus queries at planning time)."""
    labels_name_engine: bool = True
    """Its alert's job/instance labels are the engine's; False: the agent's (GPU series), and
    Facts read the engine through PolicyConfig.engine_selector."""
    restore: bool = True
    """False: its changes stay after the alert resolves (a cause that does not go away by itself)."""

    @property
    def restores(self) -> bool:
        """Its changes go back once the alert has stayed resolved for restore_after_s."""
        return self.restore and self.kind in ("config", "mode")


def _lower_seqs(config: dict[str, Any], pc: PolicyConfig, facts: Facts) -> Plan | str:
    seqs = int(config["max_num_seqs"])
    new = pc.max_num_seqs.lower(seqs, pc.step_fraction)
    if new < seqs:
        return Plan("lower_max_num_seqs", "config", {"max_num_seqs": new}, {"max_num_seqs": seqs})
    return f"max_num_seqs at its minimum {pc.max_num_seqs.minimum}"


def _cold_kv(config: dict[str, Any], pc: PolicyConfig, facts: Facts) -> Plan | str:
    cold = config.get("kv_cold_dtype", "none")
    if cold == "none":
        return Plan("enable_cold_kv_int8", "config", {"kv_cold_dtype": "int8"}, {"kv_cold_dtype": "none"})
    return f"cold KV already {cold}"


def _raise_batched_tokens(config: dict[str, Any], pc: PolicyConfig, facts: Facts) -> Plan | str:
    tokens = int(config["max_num_batched_tokens"])
    bounds = pc.max_num_batched_tokens
    new = bounds.higher(tokens, pc.step_fraction)
    if facts.prompt_tokens:
        # A chunk that holds the typical prompt whole prefills it in one step: go there at
        # once rather than one fraction per verification window (on an H100, 256-token
        # chunks met a 0.5 s TTFT for 8 % of 1.5-3k-token prompts, 512 for 69 %, 2,048 for 99 %).
        whole = PREFILL_CHUNK_QUANTUM * math.ceil(facts.prompt_tokens / PREFILL_CHUNK_QUANTUM)
        new = max(new, bounds.toward(tokens, whole))
    if new > tokens:
        return Plan(
            "raise_max_num_batched_tokens",
            "config",
            {"max_num_batched_tokens": new},
            {"max_num_batched_tokens": tokens},
        )
    return f"max_num_batched_tokens at its maximum {pc.max_num_batched_tokens.maximum}"


def _ttft(config: dict[str, Any], pc: PolicyConfig, facts: Facts) -> Plan | str:
    """Slow first tokens have four usual causes. Steps stalled on KV swap copies (a slow host
    link): preempt by recompute, as InferdKVSwapBound would, which often fires later, and
    whose step would otherwise wait behind this rule's (only one config change is verified
    at a time; in the swap_storm scenario a cold-KV step went first, was rolled back, and
    the recompute came 6 s scaled, 3 minutes, later). Requests queued on a full KV cache: more
    room (cold KV) lets them in; no batch size helps. Every seat taken while requests
    wait: more seats (a GPU decodes 32 rows in about the time of 4: on an H100 the 8B
    shape at 4 seats kept SM activity at 0.75, so the under-used rule never saw it).
    Otherwise prompts wait for prefill: bigger prefill chunks finish a queued prompt in
    fewer steps (verification rolls a step back if it made the target worse)."""
    if facts.swap_bound and config.get("preemption_mode") != "recompute":
        return _recompute(config, pc, facts)
    if facts.kv_bound:
        return _cold_kv(config, pc, facts)
    if facts.seats_full(int(config["max_num_seqs"])):
        seats = _seats_for_queue(int(config["max_num_seqs"]), pc, facts)
        if seats > int(config["max_num_seqs"]):
            return Plan(
                "raise_max_num_seqs", "config", {"max_num_seqs": seats}, {"max_num_seqs": config["max_num_seqs"]}
            )
    return _raise_batched_tokens(config, pc, facts)


def _seats_for_queue(seqs: int, pc: PolicyConfig, facts: Facts) -> int:
    """One fraction more seats, or seats for the requests waiting too where that is more:
    in one step rather than one fraction per verification window (within max_step)."""
    seats = pc.max_num_seqs.higher(seqs, pc.step_fraction)
    if facts.waiting:
        seats = max(seats, pc.max_num_seqs.toward(seqs, seqs + math.ceil(facts.waiting)))
    return seats


def _raise_batch(config: dict[str, Any], pc: PolicyConfig, facts: Facts) -> Plan | str:
    old = {"max_num_seqs": int(config["max_num_seqs"]), "max_num_batched_tokens": int(config["max_num_batched_tokens"])}
    new = {
        "max_num_seqs": _seats_for_queue(old["max_num_seqs"], pc, facts),
        "max_num_batched_tokens": pc.max_num_batched_tokens.higher(old["max_num_batched_tokens"], pc.step_fraction),
    }
    changed = {k: v for k, v in new.items() if v != old[k]}
    if not changed:
        return "max_num_seqs and max_num_batched_tokens at their maximum"
    return Plan("raise_batch", "config", changed, {k: old[k] for k in changed})


def _recompute(config: dict[str, Any], pc: PolicyConfig, facts: Facts) -> Plan | str:
    mode = config.get("preemption_mode")
    if mode == "recompute":
        return "preemption_mode is already recompute"
    return Plan("preempt_by_recompute", "config", {"preemption_mode": "recompute"}, {"preemption_mode": mode})


def _fallback(config: dict[str, Any], pc: PolicyConfig, facts: Facts) -> Plan | str:
    # Applied even when the engine already fell back on its own: the policy then owns
    # the way back to fast, so "fast" is what it restores.
    return Plan("fallback", "mode", {"mode": "fallback"}, {"mode": "fast"})


_FAULTS = "sum(rate(inferd_kv_page_faults_total{{{sel}}}[{window}]))"
_SWAP = "sum(rate(inferd_kv_swap_bytes_total{{{engine}}}[{window}]))"
# Failures within the window; a counter series born inside it (its first failure) counts
# whole, which increase() would miss.
_NEW_FAILURES = (
    "sum(inferd_engine_fastpath_failures_total{{{sel}}})"
    " - sum(inferd_engine_fastpath_failures_total{{{sel}}} offset {window})"
    " or sum(inferd_engine_fastpath_failures_total{{{sel}}})"
)

# The mean over the window, not a quantile interpolated inside a histogram bucket: two
# p99s in the same bucket read the same whatever happened.
_MEAN_TTFT = (
    "sum(rate(vllm:time_to_first_token_seconds_sum{{{sel}}}[{window}]))"
    " / sum(rate(vllm:time_to_first_token_seconds_count{{{sel}}}[{window}]))"
)

# Where SLO classes with a TTFT target serve traffic, the share of their requests that
# missed it: what the SLO promises, which the mean does not track (a step can lower the
# mean TTFT while more requests miss, e.g. by speeding up short prompts only). Without
# such classes the series are absent and `or` takes the mean TTFT.
_TTFT_MISSED_SHARE = (
    'sum(rate(inferd_slo_requests_total{{{sel},target="ttft",result="missed"}}[{window}]))'
    ' / sum(rate(inferd_slo_requests_total{{{sel},target="ttft"}}[{window}]))'
)
_TTFT = f"({_TTFT_MISSED_SHARE}) or ({_MEAN_TTFT})"

DEFAULT_RULES: dict[str, Rule] = {
    r.alert: r
    for r in (
        Rule("InferdKVCacheThrashing", "lower_max_num_seqs", "config", (_lower_seqs, _cold_kv), _FAULTS),
        # Capacity steps stay (restore=False): their alert resolves because the step worked,
        # while the load that needed it is usually still there. In the few_seats scenario
        # 2 seats came back 10 minutes (scaled) after the alert resolved, mid-shift, and
        # the breach was back within seconds.
        Rule("InferdTTFTSLOBreach", "ttft", "config", (_ttft,), _TTFT, uses_facts=True, restore=False),
        Rule(
            "InferdGPUUnderutilizedWithQueue",
            "raise_batch",
            "config",
            (_raise_batch,),
            "avg(avg_over_time(DCGM_FI_PROF_SM_ACTIVE{{{sel}}}[{window}]))",
            better="higher",
            uses_facts=True,
            labels_name_engine=False,
            restore=False,
        ),
        Rule(
            "InferdNUMARemoteMemoryHigh",
            "rebind_numa",
            "rebind",
            (),
            "max(inferd_numa_process_remote_ratio{{{sel}}})",
            reversible=False,
        ),
        Rule(
            "InferdKVSwapBound",
            "preempt_by_recompute",
            "config",
            (_recompute,),
            "sum(rate(inferd_kv_swap_seconds_total{{{sel}}}[{window}]))",
            restore=False,
        ),
        Rule("InferdPCIeLinkDegraded", "preempt_by_recompute", "config", (_recompute,), _SWAP),
        Rule("InferdPCIeBandwidthSaturated", "preempt_by_recompute", "config", (_recompute,), _SWAP),
        Rule("InferdEngineFastPathFailing", "fallback", "mode", (_fallback,), _NEW_FAILURES, reversible=False),
        Rule(
            "InferdEngineDown",
            "restart_engine",
            "restart",
            (),
            "min(up{{{engine}}})",
            better="higher",
            reversible=False,
        ),
    )
}


def judge(
    baseline: float | None, after: float | None, better: str, tolerance: float, noise: float | None = None
) -> str:
    """improved | unchanged | worse | no_data. A move counts when it exceeds both
    `tolerance` x the baseline and twice the target's own spread before the step
    (`noise`, its standard deviation): a noisy rate moving within its spread is unchanged."""
    if baseline is None or after is None:
        return "no_data"
    change = after - baseline if better == "lower" else baseline - after  # > 0 is bad
    margin = max(tolerance * abs(baseline), 2 * (noise or 0.0)) + 1e-9
    if change > margin:
        return "worse"
    if change < -margin:
        return "improved"
    return "unchanged"


def guarded(
    outcome: str,
    guard_before: float | None,
    guard_after: float | None,
    demand_before: float | None,
    demand_after: float | None,
    guard_tolerance: float,
    demand_tolerance: float,
) -> str:
    """`outcome`, or worse_guard when the guard (higher is better: output tokens/s) fell by
    more than `guard_tolerance` while the demand held (fell by no more than
    `demand_tolerance`): the step cost more than it fixed. No guard reading changes nothing."""
    if outcome in ("worse", "no_data") or guard_before is None or guard_after is None or guard_before <= 0:
        return outcome
    if demand_before is not None and demand_after is not None and demand_after < (1 - demand_tolerance) * demand_before:
        return outcome  # less to serve: serving less is no verdict on the step
    return "worse_guard" if guard_after < (1 - guard_tolerance) * guard_before else outcome


def credit(outcome: str, demand_before: float | None, demand_after: float | None, tolerance: float) -> str:
    """`outcome`, or demand_fell when an improvement came with the demand falling by more
    than `tolerance` (the load went away; the change is not what helped)."""
    if outcome != "improved" or demand_before is None or demand_after is None or demand_before <= 0:
        return outcome
    return "demand_fell" if demand_after < (1 - tolerance) * demand_before else outcome
