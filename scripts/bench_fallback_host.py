"""The portable (fallback) path against eager transformers on the CPU, host-bound.

On a GPU both run one kernel launch at a time from Python, and for the 8B shape at batch 1
and 32 both are bound by that host work, not by the GPU (BENCHMARKS.md: 10.7 / 237.8
against 13.7 / 454.7 tok/s on an H100). This runs the same two paths on the CPU over a
32-layer model of tiny width (float32), where the arithmetic is small beside the host
work, so what it compares is mostly the per-step and per-layer Python and torch dispatch
of each: our engine's step (scheduler, portable paged attention, sampler) and
transformers' `generate` (eager, SDPA attention, dynamic cache), same weights, same
prompts, greedy. It does not measure GPU kernels or launches.

    .venv/bin/python scripts/bench_fallback_host.py [--json out.json] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import transformers

from inferd.engine.bench.gpu_decode import bench_engine_decode, bench_hf
from inferd.engine.bench.random_model import hf_model_sharing_weights, make_engine
from inferd.engine.model import make_model as mm
from inferd.engine.model.loader import load_model

LAYERS = 32
PROMPT_LEN = 32
NEW_TOKENS = 64


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one thread: the host path, not the CPU's parallel arithmetic
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = mm.make_model(Path(tmp) / "deep", mm.ModelSpec(overrides={"num_hidden_layers": LAYERS}))
        model = load_model(model_dir, torch.float32, torch.device("cpu"))
        engine = make_engine(model_dir, model, device="cpu", dtype="float32", max_num_seqs=64)
        hf = hf_model_sharing_weights(model_dir, model)
        vocab = model.config.vocab_size
        gen = torch.Generator().manual_seed(1)
        prompts = torch.randint(3, vocab, (33, PROMPT_LEN), generator=gen).tolist()
        cases = {"b1": prompts[:1], "b32": prompts[1:]}
        results: dict = {}
        for case, batch in cases.items():
            bench_engine_decode(engine, batch, NEW_TOKENS)  # warm-up (bench_hf warms itself)
            ours = [bench_engine_decode(engine, batch, NEW_TOKENS) for _ in range(args.repeats)]
            theirs = bench_hf(hf, batch, NEW_TOKENS, repeats=args.repeats)
            ours_tokens, hf_tokens = ours[-1]["tokens"], theirs["tokens"]
            same = sum(a == b for a, b in zip(ours_tokens, hf_tokens))
            results[case] = {
                "fallback_tok_s": statistics.median(r["tok_s"] for r in ours),
                "hf_eager_tok_s": theirs["tok_s"],
                "ratio": statistics.median(r["tok_s"] for r in ours) / theirs["tok_s"],
                "identical_outputs": f"{same}/{len(batch)}",
            }
            r = results[case]
            print(
                f"{case}: fallback {r['fallback_tok_s']:.1f} tok/s, transformers eager {r['hf_eager_tok_s']:.1f} tok/s, "
                f"{r['ratio']:.2f}x; greedy outputs identical {r['identical_outputs']}"
            )
    if args.json:
        meta = {
            "machine": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "layers": LAYERS,
            "prompt_len": PROMPT_LEN,
            "new_tokens": NEW_TOKENS,
            "repeats": args.repeats,
        }
        Path(args.json).write_text(json.dumps({**meta, **results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
