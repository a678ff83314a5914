"""Tensor-parallel decode benchmark: tp=1 against tp=2 on one host.

`python -m inferd.engine.bench.tp_decode --out DIR` or `inferd bench tp-decode --out DIR` (two GPUs, `llama3-8b-shape` in bf16):
1. batch-1 decode: one request (--prompt-len prompt tokens, --decode-len new tokens),
   decode tokens/s after its first token, at tp=1 and tp=2;
2. the all-reduce share of a tp=2 decode step: the same request again with rank 0's
   collective timer on (it synchronises the device around each collective, so that
   run's tokens/s is not reported as a speed);
3. throughput: --requests requests of --input-len prompt and --output-len new tokens,
   all submitted at once, output tokens/s at tp=1 and tp=2.
At tp=1 the fast path decodes with CUDA graphs; tensor parallel runs the eager forward
(Triton attention, no graphs), so tp=1 is also run with its decode graphs off: the
like-for-like comparison of the sharding itself.

`--device cpu --preset tiny` is the smoke test: gloo, float32, small sizes.
Results go to DIR/results.json and are printed as a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..config import EngineConfig
from ..llm_engine import LLMEngine
from ..model.make_model import ModelSpec, make_model
from ..request.sampling_params import SamplingParams


def sync() -> None:
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)


def checkpoint(preset: str, dtype: str, model_dir: str | None) -> str:
    """A random make-model checkpoint (written once; --model reuses one)."""
    if model_dir:
        return model_dir
    out = Path(tempfile.mkdtemp(prefix=f"inferd-tp-{preset}-"))
    start = time.perf_counter()
    make_model(out, ModelSpec(preset=preset, dtype=dtype, shard_bytes=2 << 30))
    print(f"wrote {preset} to {out} in {time.perf_counter() - start:.0f} s", flush=True)
    return str(out)


def new_engine(model_dir: str, tp: int, args, graphs: bool = True):
    engine = LLMEngine(
        EngineConfig(
            model=model_dir,
            dtype=args.dtype,
            device=args.device,
            tensor_parallel_size=tp,
            kv_cache_bytes=int(args.kv_gib * (1 << 30)),
            swap_space_bytes=0,
            max_num_seqs=args.requests,
            max_num_batched_tokens=args.max_batched_tokens,
            max_model_len=args.input_len + args.output_len + 64,
        )
    )
    if not graphs:
        engine.runner.fast_decode = None  # Triton attention, eager forward: what tp > 1 runs
    return engine


def serve_all(engine, prompts: list[list[int]], max_tokens: int) -> dict:
    """All prompts at once; total seconds and seconds after the last first token."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    base = f"r{time.monotonic_ns()}-"
    sync()
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"{base}{i}", p, params)
    first: dict[str, float] = {}
    tokens: dict[str, list[int]] = {}
    steps = 0
    while engine.has_unfinished():
        outs = engine.step()
        steps += 1
        now = time.perf_counter()
        for out in outs:
            first.setdefault(out.request_id, now)
            if out.finished:
                tokens[out.request_id] = out.outputs[0].token_ids
    sync()
    end = time.perf_counter()
    if any(len(t) != max_tokens for t in tokens.values()):
        raise RuntimeError("a request stopped early")
    return {
        "seconds": end - start,
        "decode_seconds": end - max(first.values()),
        "steps": steps,
        "tokens": [tokens[f"{base}{i}"] for i in range(len(prompts))],
    }


def make_prompts(vocab: int, num: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(5, vocab, (num, length), generator=gen).tolist()


def bench_one(model_dir: str, tp: int, args, graphs: bool = True) -> dict:
    if args.device == "cpu":  # the ranks share the cores: oversubscribed OpenMP threads spin
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // tp))
    engine = new_engine(model_dir, tp, args, graphs)
    vocab = engine.model_config.vocab_size
    try:
        serve_all(engine, make_prompts(vocab, 2, 16, seed=99), 4)  # warm-up (and graph capture)
        single = make_prompts(vocab, 1, args.prompt_len, seed=1)
        r1 = serve_all(engine, single, args.decode_len)
        result = {
            "tp": tp,
            "threads_per_rank": torch.get_num_threads(),
            "graphs": graphs and tp == 1 and engine.runner.fast_decode is not None,
            "batch1_decode_tok_s": (args.decode_len - 1) / r1["decode_seconds"],
            "batch1_tokens": r1["tokens"][0],
        }
        if tp > 1:
            timer = engine.runner.model.timer
            timer.enabled = True
            timer.reset()
            r2 = serve_all(engine, single, args.decode_len)
            timer.enabled = False
            result["allreduce_share_of_step"] = timer.seconds / r2["seconds"]
            result["collectives_per_step"] = timer.count / r2["steps"]
        many = make_prompts(vocab, args.requests, args.input_len, seed=2)
        r3 = serve_all(engine, many, args.output_len)
        result.update(
            throughput_tok_s=args.requests * args.output_len / r3["seconds"],
            throughput_seconds=r3["seconds"],
            throughput_steps=r3["steps"],
            preemptions=engine.counters.num_preemptions,
            throughput_tokens=r3["tokens"],
        )
        return result
    finally:
        if tp > 1:
            engine.runner.shutdown()
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of positions where two runs chose the same token (1.0: identical)."""
    same = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    return same / max(1, sum(map(len, a)))


def environment(args) -> dict:
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": args.device,
        "preset": args.preset,
        "dtype": args.dtype,
        "cpus": len(os.sched_getaffinity(0)),
    }
    if torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return env


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="directory for results.json")
    parser.add_argument("--preset", default="llama3-8b-shape", help="make-model shape of the random checkpoint")
    parser.add_argument("--model", help="reuse this checkpoint directory instead of writing a random one")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="where the ranks run")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size compared with tp=1")
    parser.add_argument("--prompt-len", type=int, default=128, help="batch-1 prompt tokens")
    parser.add_argument("--decode-len", type=int, default=256, help="batch-1 new tokens")
    parser.add_argument("--requests", type=int, default=256, help="requests in the throughput phase")
    parser.add_argument("--input-len", type=int, default=512, help="prompt tokens per throughput request")
    parser.add_argument("--output-len", type=int, default=256, help="new tokens per throughput request")
    parser.add_argument("--kv-gib", type=float, default=40.0, help="KV pool, all ranks together")
    parser.add_argument("--max-batched-tokens", type=int, default=8192, help="max_num_batched_tokens of the engine")
    parser.add_argument("--skip-eager-tp1", action="store_true", help="skip tp=1 with decode graphs off")


def run_bench(args: argparse.Namespace) -> int:
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.tp < 2:
        raise ValueError(f"--tp must be at least 2, got {args.tp}")
    if args.device == "cuda" and torch.cuda.device_count() < args.tp:
        raise ValueError(f"--tp {args.tp} needs {args.tp} GPUs; {torch.cuda.device_count()} visible")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = checkpoint(args.preset, args.dtype, args.model)
    runs = [bench_one(model_dir, 1, args)]
    if args.device == "cuda" and not args.skip_eager_tp1:
        runs.append(bench_one(model_dir, 1, args, graphs=False))
    runs.append(bench_one(model_dir, args.tp, args))
    base, tp = runs[0], runs[-1]
    summary: dict[str, Any] = {
        "environment": environment(args),
        "args": vars(args),
        "batch1_token_agreement": agreement([base["batch1_tokens"]], [tp["batch1_tokens"]]),
        "throughput_token_agreement": agreement(base["throughput_tokens"], tp["throughput_tokens"]),
        "runs": [{k: v for k, v in r.items() if not k.endswith("tokens")} for r in runs],
    }
    (out / "results.json").write_text(json.dumps(summary, indent=2))
    print(f"{'run':<18}{'batch-1 tok/s':>15}{'allreduce share':>17}{'throughput tok/s':>18}{'preempt':>9}")
    for r in summary["runs"]:
        name = f"tp={r['tp']}" + ("" if r["tp"] > 1 else (" graphs" if r["graphs"] else " eager"))
        share = f"{r['allreduce_share_of_step']:.1%}" if "allreduce_share_of_step" in r else "-"
        print(
            f"{name:<18}{r['batch1_decode_tok_s']:>15.1f}{share:>17}{r['throughput_tok_s']:>18.1f}{r['preemptions']:>9}"
        )
    print(
        f"token agreement tp={args.tp} vs tp=1: batch-1 {summary['batch1_token_agreement']:.3f}, "
        f"throughput {summary['throughput_token_agreement']:.3f}"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    """`inferd bench tp-decode`."""
    try:
        return run_bench(args)
    except ValueError as exc:
        print(f"inferd bench tp-decode: {exc}")
        return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
