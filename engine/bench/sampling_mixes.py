"""Sampled requests against greedy ones on one offline engine, every mix in one run.

`python -m inferd.engine.bench.sampling_mixes --out DIR` (a GPU: `llama3-8b-shape`,
random weights; `--preset tiny` on the CPU). One engine serves, in turn, bursts of
`--num-requests` requests of `--prompt-len` + `--output-len` tokens: greedy, then each mix
of MIXES, with greedy again in the middle and at the end, then batch-1 decode greedy and
with top_p 0.9: whole requests, and steady decode steps (timed after the first ones).
Every burst gets prompts of its own (a first token per burst), so no burst reads
another's prefix from the cache. Each mix is reported against the mean of the
greedy bursts ("x greedy"). `inferd bench burst` measures one mix per run, offline and
through the server; this runs them all on one engine, offline only.

`INFERD_TRITON_SAMPLING=0` in the environment takes the torch sampling path on a GPU (the
A/B of the fused kernels). Results: DIR/sampling_mixes.json and a printed table.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

import torch

from ..llm import LLM
from ..request.sampling_params import SamplingParams
from .burst import for_phase, make_prompts, preset_checkpoint
from .burst_offline import offline_burst
from .burst_sampling import SamplingMix, greedy_params


def mixes(num_requests: int) -> dict[str, list[dict]]:
    """Per mix, each request's sampling fields (SamplingParams' names)."""
    return {
        "temperature 1.0": [{"temperature": 1.0}] * num_requests,
        "temperature 0.7, top_p 0.9, top_k 50": [{"temperature": 0.7, "top_p": 0.9, "top_k": 50}] * num_requests,
        "top_p 0.9 (temperature 1.0)": [{"temperature": 1.0, "top_p": 0.9}] * num_requests,
        "half greedy, half temperature 1.0": SamplingMix(temperature=1.0, mix=0.5).request_params(num_requests),
        "every row seeded (temperature 1.0)": [{"temperature": 1.0, "seed": i} for i in range(num_requests)],
        "logprobs 5 (temperature 1.0)": [{"temperature": 1.0, "logprobs": 5}] * num_requests,
        "logprobs 5 (greedy)": [{"temperature": 0.0, "logprobs": 5}] * num_requests,
        "every kind of row": [every_kind[i % len(every_kind)] for i in range(num_requests)],
    }


# Greedy, sampled through every filter, seeded, asking logprobs, penalised and biased rows in
# one batch: none of them takes the batch off the launched-ahead path.
every_kind: list[dict] = [
    {"temperature": 0.0},
    {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "min_p": 0.05},
    {"temperature": 1.0, "seed": 7},
    {"temperature": 1.0, "logprobs": 5},
    {"temperature": 0.8, "frequency_penalty": 0.5, "presence_penalty": 0.5, "logit_bias": {100: 2.0}},
    {"temperature": 0.0, "repetition_penalty": 1.1},
]


def run(args: argparse.Namespace) -> dict:
    options = {"load_format": "dummy", "max_num_seqs": args.num_requests, "max_num_batched_tokens": 8192}
    if args.device:
        options["device"] = args.device
    model_dir = preset_checkpoint(tempfile.mkdtemp(prefix="inferd-sampling-"), args.preset, options)
    vocab = json.loads(Path(model_dir, "config.json").read_text())["vocab_size"]
    llm = LLM(model_dir, **options)
    prompts = make_prompts(vocab, args.num_requests, args.prompt_len, 0)
    warm = make_prompts(vocab, 8, 64, 1)
    llm.generate(warm, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    llm.generate(warm, SamplingParams(temperature=0.7, top_p=0.9, top_k=50, max_tokens=4, ignore_eos=True, logprobs=5))
    gc.collect()
    gc.freeze()
    report: dict = {"preset": args.preset, "device": _device_name(), "runs": []}
    bursts = 0

    def burst(name: str, sampling: list[dict], batch: list[list[int]] = prompts) -> float:
        nonlocal bursts
        bursts += 1
        engine = llm.engine
        launched_before = engine.counters.decode_steps_launched_ahead
        result = offline_burst(engine, for_phase(batch, bursts, vocab), args.output_len, sampling)
        tok_s = sum(result.num_tokens) / result.wall_s
        launched = engine.counters.decode_steps_launched_ahead - launched_before
        report["runs"].append(
            {
                "name": name,
                "requests": len(batch),
                "tok_s": tok_s,
                "wall_s": result.wall_s,
                "decode_steps_launched_ahead": launched,
                "mode": engine.runner.mode,  # "fast", or "fallback" after a fault
            }
        )
        print(f"{name:40s} {tok_s:10.1f} tok/s", flush=True)
        return tok_s

    greedy = [burst("greedy", greedy_params(args.num_requests))]
    for i, (name, sampling) in enumerate(mixes(args.num_requests).items()):
        if i == 3:
            greedy.append(burst("greedy (middle)", greedy_params(args.num_requests)))
        burst(name, sampling)
    greedy.append(burst("greedy (end)", greedy_params(args.num_requests)))
    base = sum(greedy) / len(greedy)
    for entry in report["runs"]:
        entry["x_greedy"] = entry["tok_s"] / base
    one = prompts[:1]
    b1_greedy = [burst("batch 1 greedy", greedy_params(1), one)]
    b1_top_p = burst("batch 1 top_p 0.9 (temperature 1.0)", [{"temperature": 1.0, "top_p": 0.9}], one)
    b1_greedy.append(burst("batch 1 greedy (again)", greedy_params(1), one))
    report["batch1_top_p_x_greedy"] = b1_top_p / (sum(b1_greedy) / 2)
    steady = {name: _steady_step_ms(llm.engine, one[0], sampling) for name, sampling in STEADY.items()}
    report["batch1_steady_step_ms"] = steady
    report["batch1_steady_top_p_x_greedy"] = steady["greedy"] / steady["top_p 0.9 (temperature 1.0)"]
    gc.unfreeze()
    return report


STEADY = {"greedy": {"temperature": 0.0}, "top_p 0.9 (temperature 1.0)": {"temperature": 1.0, "top_p": 0.9}}
STEADY_WARM_STEPS, STEADY_TIMED_STEPS = 20, 100


def _steady_step_ms(engine, prompt: list[int], sampling: dict) -> float:
    """Mean wall time of a batch-1 decode step, timed over STEADY_TIMED_STEPS engine steps
    after STEADY_WARM_STEPS (the prefill and the first decode steps are not in it)."""
    request_id = f"steady-{len(prompt)}-{sorted(sampling.items())}"
    max_tokens = STEADY_WARM_STEPS + STEADY_TIMED_STEPS + 8
    engine.add_request(request_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling))
    for _ in range(STEADY_WARM_STEPS):
        engine.step()
    _synchronize()
    start = time.perf_counter()
    for _ in range(STEADY_TIMED_STEPS):
        engine.step()
    _synchronize()
    elapsed = time.perf_counter() - start
    while engine.has_unfinished():
        engine.step()
    return elapsed / STEADY_TIMED_STEPS * 1e3


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _device_name() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="directory for sampling_mixes.json")
    parser.add_argument("--preset", choices=("tiny", "small", "llama3-8b-shape"), default="llama3-8b-shape")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: the engine's choice")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=256)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferd.engine.bench.sampling_mixes", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sampling_mixes.json").write_text(json.dumps(report, indent=1))
    ratios = [f"{r['name']} {r['x_greedy']:.3f}" for r in report["runs"] if "x_greedy" in r]
    steady = report["batch1_steady_top_p_x_greedy"]
    print("x greedy: " + "; ".join(ratios) + f"; batch 1 top_p 0.9 {report['batch1_top_p_x_greedy']:.3f}")
    print(
        f"batch 1 steady decode, top_p 0.9 against greedy: {steady:.3f} ({report['batch1_steady_step_ms']} ms a step)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
