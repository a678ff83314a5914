"""`inferd bench throughput`: the engine against transformers `generate`, same weights.

A fixed set of prompts (deterministic, mixed lengths) runs through
1. the engine, all requests submitted at once (continuous batching);
2. transformers `generate`, one prompt at a time (how it is usually called);
3. transformers `generate`, all prompts in one left-padded batch.
Greedy decoding with a fixed number of new tokens for every request, so each side
produces exactly the same number of tokens. Prints tokens/s and the ratios; each phase
says on stderr when it starts and what it measured, the one-at-a-time phase with a
progress bar (engine/model/progress.py).
"""

from __future__ import annotations

import json
import platform
import random
import time

from ..llm import LLM
from ..model.progress import Progress, note
from ..request.sampling_params import SamplingParams


def make_prompts(vocab: int, num: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(rng.randrange(16, 128))] for _ in range(num)]


def bench_engine(model_dir: str, prompts, max_tokens: int, **config) -> float:
    note(f"[1/3] engine: loading {model_dir}, then {len(prompts)} prompts x {max_tokens} tokens at once")
    llm = LLM(model_dir, **config)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)
    note(f"      engine: {elapsed:.1f} s")
    return len(prompts) * max_tokens / elapsed


def bench_hf(model_dir: str, prompts, max_tokens: int, batched: bool) -> float:
    import torch
    import transformers

    phase = "[3/3] transformers, one padded batch" if batched else "[2/3] transformers, one prompt at a time"
    note(f"{phase}: {len(prompts)} prompts x {max_tokens} tokens")
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    kwargs = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        model.generate(torch.tensor([prompts[0]]), **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})
        start = time.perf_counter()
        if batched:
            width = max(map(len, prompts))
            ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            model.generate(ids, attention_mask=mask, **kwargs)
        else:
            with Progress(len(prompts), "      transformers", unit="prompts") as progress:
                for p in prompts:
                    model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), **kwargs)
                    progress.update()
        elapsed = time.perf_counter() - start
    note(f"      transformers: {elapsed:.1f} s")
    return len(prompts) * max_tokens / elapsed


def add_arguments(parser) -> None:
    parser.add_argument(
        "--model", required=True, help="checkpoint directory (e.g. from `inferd make-model --preset small`)"
    )
    parser.add_argument("--num-prompts", type=int, default=16, help="prompts (16-127 random token ids each)")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt, on every side")
    parser.add_argument("--skip-hf-batched", action="store_true", help="skip transformers' padded batch")
    parser.add_argument("--json", help="also write the results to this file (default: none)")


def run(args) -> int:
    import torch

    with open(f"{args.model}/config.json") as f:
        vocab = json.load(f)["vocab_size"]
    prompts = make_prompts(vocab, args.num_prompts)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
        "torch": torch.__version__,
        "num_prompts": args.num_prompts,
        "max_tokens": args.max_tokens,
        "engine_tok_s": bench_engine(args.model, prompts, args.max_tokens),
        "hf_sequential_tok_s": bench_hf(args.model, prompts, args.max_tokens, batched=False),
    }
    if not args.skip_hf_batched:
        result["hf_batched_tok_s"] = bench_hf(args.model, prompts, args.max_tokens, batched=True)
    print(f"engine                      {result['engine_tok_s']:8.1f} tok/s")
    print(
        f"transformers, one at a time {result['hf_sequential_tok_s']:8.1f} tok/s  "
        f"(engine {result['engine_tok_s'] / result['hf_sequential_tok_s']:.2f}x)"
    )
    if "hf_batched_tok_s" in result:
        print(
            f"transformers, padded batch  {result['hf_batched_tok_s']:8.1f} tok/s  "
            f"(engine {result['engine_tok_s'] / result['hf_batched_tok_s']:.2f}x)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0
