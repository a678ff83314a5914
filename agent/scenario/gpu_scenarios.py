"""The closed-loop scenarios on one GPU with the llama3-8b-shape model: KV thrashing, and a
TTFT breach after a shift to long prompts.

The engine serves `write_checkpoint_stub(DIR)` (config and tokenizer, no weights file)
with `--load-format=dummy` (random weights drawn on the GPU): run them with `--model DIR`,
as `.gpuwhl/scenario_gpu.sh` does; without `--model` the runner would write a 16 GB
random checkpoint of `model_preset` first. `--served-model-name=tiny` is not the model's
size: the runner's workload and warm-up ask for the model `tiny`
(agent/scenario/stack.py SERVED_MODEL) whatever the engine serves.

Where the numbers come from (BENCHMARKS.md, H100/H200 runs G26-G35). A KV token of the 8B
shape is 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 128 KiB, a 16-token block 2 MiB.
Decode steps take 4.5-6 ms at 2-64 rows, and a served request's TPOT was 6.8-7.7 ms at
8-16 req/s with 32 seats (G35, saturation 20.8 req/s of ShareGPT-like lengths). Prefill
and mixed steps run eagerly: a 512-token step is bound by launching the forward (about
14 ms against 11 ms of GPU time), so a 256-token chunk pays that launch for half the
tokens, while a 16 x 512-token step reached 0.98 of the matmul ceiling (21 us a token).
The calibration (`calibration_args`, `choose_shift_rate`) measures what these estimates
only guess: each scenario's shift rate is picked on the GPU between the default's
capacity and the better knob value's.

- gpu_kv_thrash: a 2 GiB KV pool (1,024 blocks, 16,384 tokens) and 32 seats. The shift
  sends prompts of 1,024-2,048 tokens with 256-token replies (104 blocks a sequence
  midway on average, 144 at most): about 10 fit, so 32 seats thrash as soon as a burst
  of arrivals lifts the concurrency past them (by recompute: the 64 MiB host swap pool
  holds less than one such sequence), and each fault prefills a long prompt again, which
  lengthens every request and so the concurrency. Eight seats fit the pool (832 blocks
  midway on average; only eight sequences all near full length, 1,152, would not) and
  cap the throughput at about 8 / 2.5 s a request: the calibration looks for the rates
  where the default's thrashing costs more than that cap. The agent's one step is
  32 -> 8 (a step is 0.75 of the value, at most 24).
- gpu_ttft_long_prompts: 256-token prefill chunks (a node tuned for short prompts) and a
  24 GiB pool (the 32 seats of 3,000-token prompts fill half of it, so the TTFT rule sees
  no full KV cache and raises max_num_batched_tokens: to the mean recent prompt rounded up
  to 256 tokens where Prometheus has it (one step 256 -> 2,304, the policy's max_step
  2,048), else doubling per step: 256 -> 512 -> 1024 -> 2048). The shift sends prompts
  of 1,536-3,072 tokens with 32-token replies.

Time scale. Phases, the policy's cooldown / verification / restore and every alert
duration (alerts/params.yml, through alerts/render.py) are multiplied by the run's
`--time-scale`; the engine is not. At 1/2: the recorder samples every 5 s, Prometheus
scrapes every 2.5 s, Alertmanager's group_wait is 15 s, InferdKVCacheThrashing needs
over 5 faults/s over its 2m window (60 s) and then `for: 2m` (60 s), InferdTTFTSLOBreach
a p99 TTFT over the scenario's own TTFT target (the run sets the rule's threshold to
it) in its 2m window (60 s) and then `for: 1m` (30 s), and the policy judges a step
120 s x 1/2 = 60 s after it. So the thrashing alert reaches the agent about 1.5-2 min
(production 3-4 min) into the shift and the TTFT alert about 1-1.5 min (production 2-3
min) in; both shifts last 6 minutes, so several steps can be judged before they end.
The thrashing scenario is 600 s at production intervals, the TTFT one 480 s; past that,
the backlog a default that misses has built drains after the last phase. A smaller
scale squeezes the alerts' windows as well: at 1/8 the thrashing window is 15 s and the
TTFT rule's `for:` 7.5 s, still several scrapes (never under 1 s), but the engine's
queue builds and drains at its own speed, so at very small scales an alert can fire and
resolve within one backlog.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .scenarios import SCENARIOS, Scenario, engine_args_with
from .workload import Phase

PRESET = "llama3-8b-shape"
KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V, layers, KV heads, head dim, bf16
GIB = 1 << 30
# Words per token of the stub's tokenizer on `inferd bench serve --dataset uniform`'s random
# words (1.77-1.96 tokens a word at 100-2,000 words): the calibration asks for words.
TOKENS_PER_WORD = 1.8

COMMON = ("--load-format=dummy", "--served-model-name=tiny", "--log-level=WARNING")

# ---- KV thrashing ----------------------------------------------------------------------

THRASH_ARGS = (*COMMON, f"--kv-cache-bytes={2 * GIB}", "--max-num-seqs=32")
THRASH_POLICY = {
    "max_num_seqs": {"minimum": 4, "maximum": 64, "max_step": 24},
    "step_fraction": 0.75,
    "cooldown_s": 600,
    "verify_window_s": 120,
    "restore_after_s": 600,
}
THRASH_STEADY = Phase("steady", 120, rate=2.0, prompt_len=(128, 256), max_tokens=128)
THRASH_SHIFT = Phase("shift", 360, rate=2.5, prompt_len=(1024, 2048), max_tokens=256)
THRASH_RECOVERY = Phase("recovery", 120, rate=2.0, prompt_len=(128, 256), max_tokens=128)

# ---- TTFT after a shift to long prompts --------------------------------------------------

TTFT_ARGS = (*COMMON, f"--kv-cache-bytes={24 * GIB}", "--max-num-batched-tokens=256", "--max-num-seqs=32")
TTFT_POLICY = {
    "max_num_batched_tokens": {"minimum": 256, "maximum": 4096, "max_step": 2048},
    "step_fraction": 1.0,
    "cooldown_s": 600,
    "verify_window_s": 120,
    "restore_after_s": 600,
}
TTFT_STEADY = Phase("steady", 60, rate=4.0, prompt_len=(128, 256), max_tokens=32)
TTFT_SHIFT = Phase("shift", 360, rate=10.0, prompt_len=(1536, 3072), max_tokens=32)
TTFT_RECOVERY = Phase("recovery", 60, rate=4.0, prompt_len=(128, 256), max_tokens=32)

# ---- an under-used GPU with a queue: too few seats for the load ----------------------------

UNDER_ARGS = (*COMMON, f"--kv-cache-bytes={24 * GIB}", "--max-num-seqs=4")
UNDER_POLICY = {
    "max_num_seqs": {"minimum": 4, "maximum": 128, "max_step": 32},
    "max_num_batched_tokens": {"minimum": 2048, "maximum": 8192, "max_step": 2048},
    "step_fraction": 1.0,
    "cooldown_s": 600,
    "verify_window_s": 120,
    "restore_after_s": 600,
}
UNDER_STEADY = Phase("steady", 60, rate=1.5, prompt_len=(128, 256), max_tokens=256)
UNDER_SHIFT = Phase("shift", 360, rate=8.0, prompt_len=(128, 256), max_tokens=256)
UNDER_RECOVERY = Phase("recovery", 60, rate=1.5, prompt_len=(128, 256), max_tokens=256)
# The shipped rule averages SM activity over 5m and waits `for: 10m`: 15 minutes before a
# first step, longer than this scenario's shift. The run uses 2m and 2m and says so.
UNDER_ALERT_PARAMS = {"durations.underutilized_window": "2m", "durations.underutilized_for": "2m"}
GPU_WATCH = {
    "sm_active": "avg(DCGM_FI_PROF_SM_ACTIVE)",
    "dram_active": "avg(DCGM_FI_PROF_DRAM_ACTIVE)",
    "waiting": "sum(vllm:num_requests_waiting)",
    "running": "sum(vllm:num_requests_running)",
}

GPU_SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="gpu_kv_thrash",
            description="8B shape on one GPU: steady short requests, then a shift to 1,024-2,048-token prompts "
            "with 256-token replies on a 2 GiB KV pool (about 10 such sequences fit) with 32 seats, then steady",
            phases=(THRASH_STEADY, THRASH_SHIFT, THRASH_RECOVERY),
            ttft_s=1.0,
            tpot_s=0.02,
            attainment_target=0.9,
            engine_args=THRASH_ARGS,
            policy=THRASH_POLICY,
            sweep={"max_num_seqs": (4, 8, 16, 32)},
            shift_phase="shift",
            model_preset=PRESET,
        ),
        Scenario(
            name="gpu_ttft_long_prompts",
            description="8B shape on one GPU: steady short prompts, then a shift to 1,536-3,072-token prompts on "
            "an engine whose prefill chunks are 256 tokens, then steady",
            phases=(TTFT_STEADY, TTFT_SHIFT, TTFT_RECOVERY),
            ttft_s=0.5,
            tpot_s=0.1,
            attainment_target=0.9,
            engine_args=TTFT_ARGS,
            policy=TTFT_POLICY,
            sweep={"max_num_batched_tokens": (256, 512, 1024, 2048)},
            shift_phase="shift",
            model_preset=PRESET,
        ),
        Scenario(
            name="gpu_underused",
            description="8B shape on one GPU with 4 seats: steady short requests, then 8 req/s of them "
            "(256-token replies), more than 4 seats serve, while the GPU could batch far more, then steady",
            phases=(UNDER_STEADY, UNDER_SHIFT, UNDER_RECOVERY),
            ttft_s=1.0,
            tpot_s=0.05,
            attainment_target=0.9,
            engine_args=UNDER_ARGS,
            policy=UNDER_POLICY,
            sweep={"max_num_seqs": (4, 8, 16, 32, 64)},
            shift_phase="shift",
            model_preset=PRESET,
            alert_params=UNDER_ALERT_PARAMS,
            gpu_metrics=True,
            watch=GPU_WATCH,
        ),
    )
}


# ---- calibration: the shift's rate between two capacities --------------------------------


@dataclass(frozen=True, slots=True)
class Calibration:
    better: Mapping[str, Any]  # the knob value that should hold the shift the default cannot
    rates: tuple[float, ...]  # offered loads tried, req/s, rising: below, between, near the better capacity


CALIBRATIONS: dict[str, Calibration] = {
    "gpu_kv_thrash": Calibration({"max_num_seqs": 8}, (1.5, 2.5, 3.5)),
    "gpu_ttft_long_prompts": Calibration({"max_num_batched_tokens": 2048}, (6.0, 10.0, 14.0)),
    "gpu_underused": Calibration({"max_num_seqs": 32}, (3.0, 8.0, 14.0)),
}
CONFIGS = ("default", "better")
SHARE_ABOVE_DEFAULT = 0.4  # where between the two capacities the shift rate goes
MIN_OVER_DEFAULT = 1.1  # and at least this much over the default's


def shift_of(scenario: Scenario) -> Phase:
    if scenario.shift_phase is None:
        raise ValueError(f"scenario {scenario.name!r} has no shift phase")
    return next(p for p in scenario.phases if p.name == scenario.shift_phase)


def calibration_args(
    name: str, config: str, *, model: str, out: str, duration_s: float = 15.0, rates: Sequence[float] | None = None
) -> list[str]:
    """`inferd bench serve` options (after `bench serve`) that start the engine with the
    scenario's default configuration or its better knob value and offer the shift's
    lengths at the calibration's rates, judged by the scenario's SLO."""
    if config not in CONFIGS:
        raise ValueError(f"config must be one of {', '.join(CONFIGS)}, got {config!r}")
    scenario = GPU_SCENARIOS[name]
    calibration = CALIBRATIONS[name]
    shift = shift_of(scenario)
    engine_args = engine_args_with(scenario.engine_args, calibration.better if config == "better" else {})
    low, high = (max(1, round(n / TOKENS_PER_WORD)) for n in shift.prompt_len)
    return [
        "--model",
        model,
        *(f"--server-arg={arg}" for arg in engine_args),
        "--dataset",
        "uniform",
        f"--prompt-len={low},{high}",
        f"--max-tokens={shift.max_tokens}",
        f"--rates={','.join(f'{r:g}' for r in rates or calibration.rates)}",
        f"--duration={duration_s:g}",
        f"--seed={scenario.seed}",
        f"--slo-class=shift:share=1,ttft={scenario.ttft_s:g},tpot={scenario.tpot_s:g}",
        "--out",
        out,
    ]


def capacity(levels: Sequence[tuple[float, float | None]], target: float) -> float | None:
    """The offered load (req/s) up to which the attainment holds `target`, from levels of
    (offered rate, attainment) rising: interpolated between the last level that met it
    and the first that missed; math.inf when every level met it, None when the first
    missed. A level without an attainment (nothing finished) counts as a miss."""
    last: tuple[float, float] | None = None
    for rate, attainment in sorted(levels):
        if attainment is None or attainment < target:
            if last is None:
                return None
            met_rate, met = last
            missed = 0.0 if attainment is None else attainment
            return met_rate + (rate - met_rate) * (met - target) / (met - missed)
        last = (rate, attainment)
    return math.inf if last is not None else None


def levels_of(report: Mapping[str, Any]) -> list[tuple[float, float | None]]:
    """(offered rate, attainment) of each level of an `inferd bench serve` JSON report."""
    return [(float(level["offered_rate"]), level.get("attainment")) for level in report["levels"]]


def choose_shift_rate(
    default: Sequence[tuple[float, float | None]],
    better: Sequence[tuple[float, float | None]],
    target: float,
    fallback: float,
) -> tuple[float, str]:
    """The shift's rate, and why: SHARE_ABOVE_DEFAULT of the way from the default's
    capacity to the better value's (at least MIN_OVER_DEFAULT x the default's), so the
    default misses its SLO and the better value can hold it. Where the levels do not
    separate them, a rate that still makes the point they allow, or `fallback`."""
    cap_default, cap_better = capacity(default, target), capacity(better, target)
    tried = sorted(r for r, _ in [*default, *better])
    if not tried:
        return fallback, "no calibration levels: the scenario's own rate"
    caps = f"capacity at attainment {target:g}: default {_rate(cap_default)}, better {_rate(cap_better)} req/s"
    if cap_default is None and cap_better is None:
        return fallback, f"{caps}: both miss at every level; the scenario's own rate"
    if cap_default is None:
        assert cap_better is not None
        return tried[0], f"{caps}: the default misses already at the lowest level, which the better value holds"
    if math.isinf(cap_default):
        return tried[-1], f"{caps}: the default holds every level; the highest level tried (no separation)"
    if cap_better is None or cap_better <= cap_default:
        rate = cap_default * 1.2
        return round(rate, 2), f"{caps}: the better value does not hold more; 1.2 x the default's capacity"
    high = tried[-1] if math.isinf(cap_better) else cap_better
    rate = max(cap_default + SHARE_ABOVE_DEFAULT * (high - cap_default), MIN_OVER_DEFAULT * cap_default)
    return round(min(rate, high), 2), f"{caps}: {SHARE_ABOVE_DEFAULT:g} of the way from the default's to the better's"


def _rate(value: float | None) -> str:
    if value is None:
        return "< lowest level"
    return "> highest level" if math.isinf(value) else f"{value:.2f}"


# ---- what .gpuwhl/scenario_gpu.sh asks --------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferd.agent.scenario.gpu_scenarios")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench-args", help="the calibration's `inferd bench serve` options, shell-quoted")
    bench.add_argument("name", choices=sorted(GPU_SCENARIOS))
    bench.add_argument("config", choices=CONFIGS)
    bench.add_argument("--model", required=True)
    bench.add_argument("--out", required=True)
    bench.add_argument("--duration", type=float, default=15.0)
    bench.add_argument("--rates", help="R1,R2,... instead of the calibration's")
    choose = sub.add_parser("choose", help="the shift rate from the two calibration reports")
    choose.add_argument("name", choices=sorted(GPU_SCENARIOS))
    choose.add_argument("default", type=Path)
    choose.add_argument("better", type=Path)
    info = sub.add_parser("info", help="production duration (s), the better knob as KNOB=VALUE, the shift rate")
    info.add_argument("name", choices=sorted(GPU_SCENARIOS))
    args = parser.parse_args(argv)
    if args.command == "bench-args":
        rates = [float(r) for r in args.rates.split(",")] if args.rates else None
        options = calibration_args(
            args.name, args.config, model=args.model, out=args.out, duration_s=args.duration, rates=rates
        )
        print(shlex.join(options))
        return 0
    scenario = GPU_SCENARIOS[args.name]
    if args.command == "info":
        (knob, value), *_ = CALIBRATIONS[args.name].better.items()
        print(f"{scenario.duration_s:g} {knob}={value} {shift_of(scenario).rate:g}")
        return 0
    reports = []
    for path in (args.default, args.better):
        try:
            reports.append(levels_of(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            reports.append([])
    default, better = reports
    rate, why = choose_shift_rate(default, better, scenario.attainment_target, shift_of(scenario).rate)
    print(f"{rate:g}")
    print(f"shift rate {rate:g} req/s: {why}", file=sys.stderr)
    return 0


SCENARIOS.update(GPU_SCENARIOS)  # whichever of the two modules is imported first

if __name__ == "__main__":
    sys.exit(main())
