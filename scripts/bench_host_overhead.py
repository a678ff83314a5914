"""Host work per engine step, the model forward excluded.

Builds a tiny random checkpoint, runs the engine on CPU and, once every request has
its first token, times each remaining step with `engine.runner.execute` (the model
forward and its input preparation) subtracted. What is left is the engine's own
Python work per step: scheduling, sampling, appending tokens, detokenising, stop
checks and building outputs; the same code runs on the host beside the GPU.

Cases:
  decode256: 256 requests, 64-token prompts, 64 greedy new tokens (ignore_eos)
  long8:     8 requests, 8,192-token prompts, 32 greedy new tokens (ignore_eos)
  decode256x256 (not run by default): 256 requests, 64-token prompts, 256 new tokens,
             the output length of the 256 x (512+256) throughput benchmark

    .venv/bin/python scripts/bench_host_overhead.py [--json out.json] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferd.engine.config import EngineConfig
from inferd.engine.llm_engine import LLMEngine
from inferd.engine.model.make_model import ModelSpec, make_model
from inferd.engine.request.sampling_params import SamplingParams

CASES = {
    "decode256": dict(num_requests=256, prompt_len=64, max_tokens=64),
    "long8": dict(num_requests=8, prompt_len=8192, max_tokens=32),
    "decode256x256": dict(num_requests=256, prompt_len=64, max_tokens=256),
}
DEFAULT_CASES = "decode256,long8"


def run_case(
    model_dir: str, name: str, num_requests: int, prompt_len: int, max_tokens: int, profile: bool, top: int
) -> dict:
    config = EngineConfig(
        model=model_dir,
        device="cpu",
        dtype="float32",
        max_num_seqs=max(num_requests, 1),
        max_num_batched_tokens=16384,
        max_model_len=prompt_len + max_tokens + 16,
        kv_cache_bytes=512 << 20,
        swap_space_bytes=0,
    )
    engine = LLMEngine(config)
    rng = random.Random(0)
    vocab = engine.tokenizer.vocab_size
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(num_requests):
        engine.add_request(f"r{i}", [rng.randrange(vocab) for _ in range(prompt_len)], params)

    model_time = 0.0
    profiler = cProfile.Profile() if profile else None
    execute = engine.runner.execute

    def timed_execute(batch):
        nonlocal model_time
        if profiler is not None:
            profiler.disable()
        start = time.perf_counter()
        try:
            return execute(batch)
        finally:
            model_time += time.perf_counter() - start
            if profiler is not None:
                profiler.enable()

    engine.runner.execute = timed_execute
    started: set[str] = set()
    while len(started) < num_requests:  # prefill until every request has its first token
        for out in engine.step():
            started.add(out.request_id)

    host_ms: list[float] = []
    num_tokens = 0
    while engine.has_unfinished():
        model_time = 0.0
        if profiler is not None:
            profiler.enable()
        start = time.perf_counter()
        outputs = engine.step()
        wall = time.perf_counter() - start
        if profiler is not None:
            profiler.disable()
        host_ms.append((wall - model_time) * 1e3)
        num_tokens += len(outputs)
    result = {
        "case": name,
        "num_requests": num_requests,
        "prompt_len": prompt_len,
        "max_tokens": max_tokens,
        "num_steps": len(host_ms),
        "num_outputs": num_tokens,
        "host_ms_per_step_median": round(statistics.median(host_ms), 3),
        "host_ms_per_step_mean": round(statistics.fmean(host_ms), 3),
        "host_ms_per_step_max": round(max(host_ms), 3),
    }
    if profiler is not None:
        print(f"--- {name}: cProfile of the timed steps, model forward excluded ---")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(top)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"comma-separated: {', '.join(CASES)}")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--profile", action="store_true", help="print a cProfile top list per case")
    parser.add_argument("--top", type=int, default=30, help="rows of the profile to print")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        make_model(tmp, ModelSpec(preset="tiny", dtype="float32"))
        for name in args.cases.split(","):
            if name not in CASES:
                parser.error(f"unknown case {name!r}; known: {', '.join(CASES)}")
            r = run_case(tmp, name, **CASES[name], profile=args.profile, top=args.top)
            print(
                f"{name}: {r['num_steps']} steps, host work per step median {r['host_ms_per_step_median']:.2f} ms, "
                f"mean {r['host_ms_per_step_mean']:.2f} ms, max {r['host_ms_per_step_max']:.2f} ms"
            )
            results.append(r)
    import tokenizers

    meta = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
