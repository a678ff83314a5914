"""Host time of the fast path's eager step (prefill and mixed steps), per layer, on CPU.

A step the decode graphs do not take runs the fast path's forward eagerly
(FastDecoder.forward_step): per layer, the fused ops' Triton launches, the cuBLAS
products and the grouped SDPA attention. For a short prompt on the GPU that step is
bound by the host issuing it. This runs the same Python on the CPU over a 32-layer model
of tiny width (float32, so the products cost little next to the host work) with the
Triton kernels' launches replaced by a counter: what it times is our code and torch's
dispatch around the kernels. The launches themselves, Triton's and CUDA's, need a GPU
and are not in these figures.

Cases (short, so that the CPU's own arithmetic stays small beside the host work):
  fresh16:    one fresh 16-token prompt (flash attention's causal path on the GPU)
  prefix16:   16 new tokens after 64 cached ones (the masked SDPA path)
  two_groups: both in one step (two SDPA calls a layer, rows written back per group)

    .venv/bin/python scripts/bench_eager_host.py [--json out.json] [--repeats 200] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from inferd.engine.fast_path import fused_ops
from inferd.engine.fast_path.attention import triton_paged_attention
from inferd.engine.fast_path.fast_decoder import FastDecoder
from inferd.engine.fast_path.warmup import synthetic_metadata
from inferd.engine.model.model import LlamaModel
from inferd.engine.model.model_config import ModelConfig

LAYERS = 32
BLOCK_SIZE = 16
CASES = {
    "fresh16": ((16, 16),),
    "prefix16": ((16, 80),),
    "two_groups": ((16, 16), (16, 80)),
}
STUBBED_KERNELS = ("_add_rms_norm_kernel", "_silu_and_mul_kernel", "_rope_and_cache_kernel")


class LaunchCounter:
    """Stands in for a Triton kernel: `kernel[grid](*args)` counts and does nothing."""

    def __init__(self) -> None:
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs) -> None:
            self.launches += 1

        return launch


def build_decoder() -> FastDecoder:
    cfg = ModelConfig.from_dict(
        dict(
            architectures=["LlamaForCausalLM"],
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
            max_position_embeddings=4096,
        )
    )
    model = LlamaModel(cfg).eval()
    blocks = -(-max(ctx for step in CASES.values() for _, ctx in step) // BLOCK_SIZE) + 1
    shape = (blocks, BLOCK_SIZE, cfg.num_key_value_heads, cfg.head_dim)
    kv = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(LAYERS)]
    return FastDecoder(model, kv)


def time_case(decoder: FastDecoder, step: tuple, repeats: int, counter: LaunchCounter) -> dict:
    tokens = sum(n for n, _ in step)
    ids = torch.zeros(tokens, dtype=torch.long)
    device = torch.device("cpu")
    for _ in range(3):
        decoder.forward_step(ids, synthetic_metadata(step, BLOCK_SIZE, device), triton_paged_attention)
    counter.launches = 0
    times = []
    for _ in range(repeats):
        meta = synthetic_metadata(step, BLOCK_SIZE, device)  # a new step's metadata: its plan is built once
        start = time.perf_counter()
        decoder.forward_step(ids, meta, triton_paged_attention)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {
        "ms_per_step_median": round(median * 1e3, 3),
        "us_per_layer_median": round(median / LAYERS * 1e6, 1),
        "ms_per_step_min": round(min(times) * 1e3, 3),
        "stubbed_launches_per_layer": counter.launches / repeats / LAYERS,
    }


def run_cases(names: list[str], args: argparse.Namespace, counter: LaunchCounter) -> dict:
    decoder = build_decoder()
    results = {}
    with torch.inference_mode():
        for name in names:
            results[name] = r = time_case(decoder, CASES[name], args.repeats, counter)
            print(
                f"{name}: {r['ms_per_step_median']:.2f} ms a step, {r['us_per_layer_median']:.1f} us a layer "
                f"(median of {args.repeats}; {r['stubbed_launches_per_layer']:g} stubbed launches a layer)"
            )
            if args.profile:
                profiler = cProfile.Profile()
                step = CASES[name]
                ids = torch.zeros(sum(n for n, _ in step), dtype=torch.long)
                profiler.enable()
                for _ in range(20):
                    decoder.forward_step(ids, synthetic_metadata(step, BLOCK_SIZE, ids.device), triton_paged_attention)
                profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated: {', '.join(CASES)}")
    parser.add_argument("--repeats", type=int, default=200, help="timed steps per case (median kept)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--profile", action="store_true", help="print a cProfile top list per case")
    parser.add_argument("--top", type=int, default=30, help="rows of the profile to print")
    args = parser.parse_args(argv)
    names = args.cases.split(",")
    for name in names:
        if name not in CASES:
            parser.error(f"unknown case {name!r}; known: {', '.join(CASES)}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # host work is one thread; the products stay small
    torch.set_flush_denormal(True)  # stubbed kernels leave their outputs unwritten
    counter = LaunchCounter()
    kernels = {name: getattr(fused_ops, name, None) for name in STUBBED_KERNELS}
    for name in STUBBED_KERNELS:
        setattr(fused_ops, name, counter)
    try:
        results = run_cases(names, args, counter)
    finally:  # leave the process as it was (the tests call main in theirs)
        for name, kernel in kernels.items():
            setattr(fused_ops, name, kernel)
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
    meta = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "layers": LAYERS,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
