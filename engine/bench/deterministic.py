"""Deterministic mode against the default one: batch invariance and its cost.

`python -m inferd.engine.bench.deterministic --out DIR` (the H200: `llama3-8b-shape` in
bf16, random weights; `--device cpu` runs the `tiny` preset in bf16 on the CPU). For each
mode, on an engine of its own: 16 greedy probe requests run one at a time, then the same
16 inside a burst of `--burst` requests submitted at once (the others random prompts of
the same length); how many probes' tokens are identical in the two runs, the burst's
output tokens/s and the batch-1 decode tokens/s. The default mode runs first: deterministic
mode switches its model for good. With `--eager`, deterministic mode runs again with its
decode steps eager instead of in CUDA graphs, and the probes' tokens of the two are
compared. Results: DIR/deterministic.json and a printed table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ..request.sampling_params import SamplingParams
from .gpu_harness import build, environment, free_dropped_engines, new_engine, prompts, run_requests, sync


def probe_alone(engine, probes: list[list[int]], max_tokens: int) -> list[list[int]]:
    return [run_requests(engine, [p], max_tokens)["tokens"][0] for p in probes]


def batch1_tok_s(engine, prompt: list[int], max_tokens: int) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    engine.add_request(f"warm{time.monotonic_ns()}", prompt, params)
    while engine.has_unfinished():
        engine.step()
    sync()
    start = time.perf_counter()
    engine.add_request(f"b1{time.monotonic_ns()}", prompt, params)
    while engine.has_unfinished():
        engine.step()
    sync()
    return max_tokens / (time.perf_counter() - start)


def measure(model_dir, model, deterministic: bool, args, probes, others, graphs: bool = True) -> dict:
    """One mode's probes alone and in the burst, and its speed. `graphs=False`: deterministic
    mode with its decode steps eager (no batch_invariant_graphs), to compare against."""
    engine = new_engine(model_dir, model, kv_gib=args.kv_gib, deterministic=deterministic)
    if not graphs:
        engine.runner.invariant_decode = None
    decode_graphs = getattr(engine.runner, "invariant_decode", None)
    alone = probe_alone(engine, probes, args.max_tokens)
    burst = run_requests(engine, probes + others, args.max_tokens)
    in_burst = burst["tokens"][: len(probes)]
    result = {
        "deterministic": deterministic,
        "decode_graphs": decode_graphs is not None,
        "fast_path_unavailable": engine.fast_path_unavailable,
        "probes_identical": sum(a == b for a, b in zip(alone, in_burst)),
        "probes": len(probes),
        "burst_requests": len(probes) + len(others),
        "burst_seconds": burst["seconds"],
        "burst_output_tok_s": burst["output_tokens"] / burst["seconds"],
        "batch1_decode_tok_s": batch1_tok_s(engine, probes[0], args.max_tokens),
        "alone_tokens": alone,
    }
    if decode_graphs is not None:
        result["graph_replays"] = decode_graphs.num_replays
    del engine
    free_dropped_engines()
    return result


def mode_name(mode: dict) -> str:
    """A measured mode's name for the printed tables."""
    if not mode["deterministic"]:
        return "default"
    return "deterministic" if mode.get("decode_graphs") else "det. eager"


def compare_modes(modes: list[dict]) -> dict:
    """Takes every mode's probe tokens out of `modes`; where deterministic mode ran with
    and without its decode graphs, how many probes' tokens the two gave alike."""
    alone = [m.pop("alone_tokens") for m in modes]
    with_graphs = [a for m, a in zip(modes, alone) if m["deterministic"] and m["decode_graphs"]]
    eager = [a for m, a in zip(modes, alone) if m["deterministic"] and not m["decode_graphs"]]
    if not with_graphs or not eager:
        return {}
    return {"probes_same_with_and_without_graphs": sum(a == b for a, b in zip(with_graphs[0], eager[0]))}


def run(args: argparse.Namespace) -> int:
    device = args.device
    preset = "llama3-8b-shape" if device == "cuda" else "tiny"
    model_dir, model = build(preset=preset, device=device, dtype="bfloat16")
    vocab = model.embed_tokens.weight.shape[0]
    probes = prompts(vocab, 16, args.prompt_len, seed=1)
    others = prompts(vocab, args.burst - 16, args.prompt_len, seed=2)
    env = environment() if device == "cuda" else {"device": "cpu", "torch": torch.__version__}
    results = {"environment": env, "preset": preset, "prompt_len": args.prompt_len}
    results["max_tokens"] = args.max_tokens
    results["modes"] = [measure(model_dir, model, det, args, probes, others) for det in (False, True)]
    if args.eager:
        results["modes"].append(measure(model_dir, model, True, args, probes, others, graphs=False))
    results.update(compare_modes(results["modes"]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "deterministic.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'mode':<14}{'probes identical':>18}{'burst tok/s':>13}{'batch-1 tok/s':>15}")
    for m in results["modes"]:
        name = mode_name(m)
        same = f"{m['probes_identical']}/{m['probes']}"
        print(f"{name:<14}{same:>18}{m['burst_output_tok_s']:>13.0f}{m['batch1_decode_tok_s']:>15.1f}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="directory for deterministic.json")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--burst", type=int, default=256, help="requests in the burst, the 16 probes included")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--kv-gib", type=float, default=24)
    parser.add_argument(
        "--eager", action="store_true", help="also run deterministic mode with its decode steps eager, and compare"
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m inferd.engine.bench.deterministic", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
