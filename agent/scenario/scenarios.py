"""The scenarios, as data: phases, SLO, the default configuration, what a sweep tries.

Durations (phases, the policy's cooldown, verification and restore) are at production
intervals; a run at `--time-scale F` multiplies each by F, as alerts/render.py does the
rules'. Rates and lengths are not scaled: the engine serves at its own speed.

The numbers are for the tiny model on a CPU (what CI has): a KV pool of 24 blocks of 16
tokens (`--kv-cache-bytes=196608`), as tests/test_e2e_remediation.py sets up thrashing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferd.engine.bench.slo_classes import SloClass
from inferd.engine.config import validate_tunable

from .stack import SUPERVISION
from .workload import Phase

POLICY_DURATIONS = ("cooldown_s", "verify_window_s", "restore_after_s")
# fastpath: POST /admin/fault, a fast-path failure as the engine's own checks would report
# one (the engine needs --enable-fault-injection). kill: SIGKILL to the engine's process
# group. hang: SIGSTOP to it (alive, holding its port, answering nothing). slow_swap:
# POST /admin/fault, every KV block swapped costs seconds_per_block more (a PCIe link
# trained down), from then on.
FAULT_KINDS = ("fastpath", "kill", "hang", "slow_swap")


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    phase: str  # injected as this phase starts
    seconds_per_block: float = 0.0  # slow_swap only

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind must be one of {', '.join(FAULT_KINDS)}; got {self.kind!r}")
        if (self.kind == "slow_swap") != (self.seconds_per_block > 0):
            raise ValueError("seconds_per_block (> 0) goes with a slow_swap fault, and only with it")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    phases: tuple[Phase, ...]  # durations at production intervals
    ttft_s: float  # a request meets its SLO when TTFT <= ttft_s and TPOT <= tpot_s
    tpot_s: float
    attainment_target: float  # the share of requests per interval that must meet the SLO
    engine_args: tuple[str, ...]  # the default configuration (`inferd serve` options)
    policy: Mapping[str, Any]  # the agent's remediation settings, durations at production intervals
    sweep: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)  # knob -> values a best-static sweep tries
    shift_phase: str | None = None  # recovery is measured from this phase's start
    seed: int = 0
    model_preset: str = "tiny"  # the make-model preset the engine serves (random weights)
    faults: tuple[Fault, ...] = ()
    # Who runs the engine in the default way: the agent in dry run (its supervisor still
    # restarts a dead or stalled engine: that is not remediation), or, where the scenario is
    # about the engine dying, a plain restart-on-exit runtime without the agent.
    default_supervision: str = "agent"
    # SECTION.KEY -> value over alerts/params.yml for this scenario (render.py --set), at
    # production intervals; the run states them. Empty: the shipped defaults.
    alert_params: Mapping[str, Any] = field(default_factory=dict)
    # The agent's GPU collector on (NVML; a GPU scenario whose rule reads DCGM_FI_PROF_*).
    gpu_metrics: bool = False
    # name -> PromQL, read from Prometheus into every timeline record (what the rule sees).
    watch: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [p.name for p in self.phases]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"scenario {self.name!r}: phases need distinct names, got {names}")
        for phase in [self.shift_phase, *(f.phase for f in self.faults)]:
            if phase is not None and phase not in names:
                raise ValueError(f"scenario {self.name!r}: no phase {phase!r}")
        if self.default_supervision not in SUPERVISION:
            raise ValueError(f"scenario {self.name!r}: default_supervision must be one of {', '.join(SUPERVISION)}")
        if not 0 < self.attainment_target <= 1:
            raise ValueError(f"scenario {self.name!r}: attainment_target must be in (0, 1]")
        for knob, values in self.sweep.items():
            for value in values:
                validate_tunable(knob, value)

    @property
    def slo(self) -> SloClass:
        return SloClass(self.name, 1.0, ttft_s=self.ttft_s, tpot_s=self.tpot_s)

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    def scaled_phases(self, time_scale: float) -> list[Phase]:
        return [p.scaled(time_scale) for p in self.phases]

    def scaled_policy(self, time_scale: float) -> dict[str, Any]:
        policy = dict(self.policy)
        for key in POLICY_DURATIONS:
            if key in policy:
                policy[key] = policy[key] * time_scale
        return policy


def engine_args_with(args: Sequence[str], settings: Mapping[str, Any]) -> list[str]:
    """`args` with each setting (a tunable, checked against its bounds) as its
    `--kebab-case=value` option, replacing the option where `args` has it."""
    for knob, value in settings.items():
        validate_tunable(knob, value)
    flags = {f"--{knob.replace('_', '-')}": value for knob, value in settings.items()}
    kept = [a for a in args if a.split("=", 1)[0] not in flags]
    return kept + [f"{flag}={value}" for flag, value in flags.items()]


# ---- the tiny model's node: a KV pool that 16 sequences of 64 tokens overrun ----------

TINY_SMALL_POOL = (
    "--kv-cache-bytes=196608",  # 24 blocks of 16 tokens
    "--max-num-seqs=16",
    "--served-model-name=tiny",
    "--log-level=WARNING",
)
# The remediation settings of tests/test_e2e_remediation.py at production intervals
# (x 1/30: cooldown 20 s, verification 6 s), one step 16 -> 4, but the agent's default
# restore_after_s (x 1/30: 20 s), so a lowered value outlasts a short lull in the faults,
# and the agent's default floor of 4 seats: with a floor of 1 the swap storm's thrash rule
# took a second step 4 -> 1 after the recompute, and the backlog of the one verification
# window it held (6 s scaled) breached TTFT for 20 s more (attainment 69%).
TINY_POLICY = {
    "max_num_seqs": {"minimum": 4, "maximum": 64, "max_step": 12},
    "step_fraction": 0.75,
    "cooldown_s": 600,
    "verify_window_s": 180,
    "restore_after_s": 600,
}
TTFT_S, TPOT_S, TARGET = 2.0, 0.25, 0.9
STEADY = Phase("steady", 600, rate=2.0, prompt_len=(8, 16), max_tokens=16)

# A node tuned for short prompts: prefill chunks of 256 tokens keep decode steps short,
# until long prompts arrive and each waits several steps for its prefill. The KV pool
# is the CPU default (256 MiB), so the queue is not KV-bound and the TTFT rule raises
# max_num_batched_tokens rather than turning cold KV on.
TINY_SHORT_CHUNKS = (
    "--max-num-batched-tokens=256",
    "--max-num-seqs=16",
    "--served-model-name=tiny",
    "--log-level=WARNING",
)
TTFT_POLICY = {
    "max_num_batched_tokens": {"minimum": 256, "maximum": 4096, "max_step": 1024},
    "step_fraction": 0.75,
    "cooldown_s": 600,
    "verify_window_s": 180,
    "restore_after_s": 600,
}

# Too few seats for the load, room everywhere else (the CPU default KV pool, 256 MiB): the
# queue waits for a seat, which the TTFT rule sees (every seat taken, requests waiting).
TINY_FEW_SEATS = ("--max-num-seqs=2", "--served-model-name=tiny", "--log-level=WARNING")
# Steady load whose engine has fault injection on: a fast-path failure is injected as the
# "shift" phase starts, with nothing else changing.
TINY_FAULTABLE = ("--max-num-seqs=16", "--served-model-name=tiny", "--enable-fault-injection", "--log-level=WARNING")
RECOVERY = Phase("recovery", 600, rate=2.0, prompt_len=(8, 16), max_tokens=16)


def shifted(
    name: str,
    description: str,
    shift: Phase,
    engine_args: tuple[str, ...],
    policy: Mapping[str, Any],
    sweep: Mapping[str, tuple[Any, ...]],
    faults: tuple[Fault, ...] = (),
    default_supervision: str = "agent",
) -> Scenario:
    """Steady load, `shift`, then steady again; recovery measured from the shift."""
    return Scenario(
        name=name,
        description=description,
        phases=(STEADY, shift, RECOVERY),
        ttft_s=TTFT_S,
        tpot_s=TPOT_S,
        attainment_target=TARGET,
        engine_args=engine_args,
        policy=policy,
        sweep=sweep,
        shift_phase="shift",
        faults=faults,
        default_supervision=default_supervision,
    )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="control",
            description="30 minutes of steady load with noise (Poisson arrivals, prompt lengths drawn), "
            "no fault: the agent must take no action and no alert may fire",
            phases=(Phase("steady", 1800, rate=2.0, prompt_len=(8, 16), max_tokens=16),),
            ttft_s=TTFT_S,
            tpot_s=TPOT_S,
            attainment_target=TARGET,
            engine_args=TINY_SMALL_POOL,
            policy=TINY_POLICY,
            sweep={"max_num_seqs": (4, 8, 12, 16)},
        ),
        shifted(
            "kv_thrash",
            "steady load, then a shift to many sequences of long replies on a small KV pool "
            "(16 req/s of 140-token sequences: each grows to 9 of the pool's 24 blocks, max_num_seqs lets "
            "16 in), then back to steady",
            Phase("shift", 1500, rate=16.0, prompt_len=(16, 24), max_tokens=120),
            TINY_SMALL_POOL,
            TINY_POLICY,
            {"max_num_seqs": (4, 8, 12, 16)},
        ),
        shifted(
            "ttft_long_prompts",
            "steady short prompts, then a shift to long prompts (1,200-1,600 tokens) on an engine "
            "whose prefill chunks are 256 tokens, then back to steady",
            Phase("shift", 1500, rate=3.0, prompt_len=(1200, 1600), max_tokens=16),
            TINY_SHORT_CHUNKS,
            TTFT_POLICY,
            {"max_num_batched_tokens": (256, 512, 1024, 2048)},
        ),
        shifted(
            "few_seats",
            "steady load, then 10 req/s of short prompts with 240-token replies on an engine capped at 2 seats "
            "(2 seats serve about 5 req/s; the tiny model decodes 16 rows in about the time of 2, as a GPU "
            "does), then back to steady",
            Phase("shift", 1500, rate=10.0, prompt_len=(8, 16), max_tokens=240),
            TINY_FEW_SEATS,
            TINY_POLICY,
            {"max_num_seqs": (2, 4, 8, 16)},
        ),
        shifted(
            "fastpath_fault",
            "steady load; a fast-path failure injected as the shift phase starts (the load unchanged): the "
            "agent switches the engine to its fallback path and back to fast once the alert has resolved",
            Phase("shift", 900, rate=2.0, prompt_len=(8, 16), max_tokens=16),
            TINY_FAULTABLE,
            TINY_POLICY,
            {"mode": ("fast", "fallback")},
            faults=(Fault("fastpath", "shift"),),
        ),
        shifted(
            "swap_storm",
            "kv_thrash's shift on a node whose host link slows down as the shift starts: every swapped KV "
            "block costs 5 ms more (a PCIe link trained down), so each preemption by swap stalls the steps",
            Phase("shift", 1500, rate=16.0, prompt_len=(16, 24), max_tokens=120),
            (*TINY_SMALL_POOL, "--enable-fault-injection"),
            TINY_POLICY,
            {"max_num_seqs": (4, 8, 16), "preemption_mode": ("swap", "recompute")},
            faults=(Fault("slow_swap", "shift", seconds_per_block=0.005),),
        ),
        shifted(
            "engine_killed",
            "steady load; the engine's process group killed (SIGKILL) as the shift phase starts. The default is "
            "the engine under a restart-on-exit runtime without the agent; no knob to sweep",
            Phase("shift", 900, rate=2.0, prompt_len=(8, 16), max_tokens=16),
            TINY_FAULTABLE,
            TINY_POLICY,
            {},
            faults=(Fault("kill", "shift"),),
            default_supervision="restart_on_exit",
        ),
        shifted(
            "engine_hung",
            "steady load; the engine's process group stopped (SIGSTOP) as the shift phase starts: alive, holding "
            "its port, answering nothing. The default is the engine under a restart-on-exit runtime without the "
            "agent; no knob to sweep",
            Phase("shift", 900, rate=2.0, prompt_len=(8, 16), max_tokens=16),
            TINY_FAULTABLE,
            TINY_POLICY,
            {},
            faults=(Fault("hang", "shift"),),
            default_supervision="restart_on_exit",
        ),
    )
}

# The GPU scenarios (8B shape: agent/scenario/gpu_scenarios.py) add themselves to SCENARIOS
# when imported; imported last, as that module imports this one.
from . import gpu_scenarios  # noqa: E402, F401
