"""End-to-end decode with cold KV at long context on a GPU (issue 9).

The llama3-8b-shape model (random weights drawn on the GPU), 8 requests of 32,768 random
prompt tokens and 33 new tokens each, all submitted at once, for kv_cold_dtype none and
int8 (hot window 128). Reports the decode rate after every request has its first token,
and the whole run's time. Usage: python -m engine.bench.kv_quant_e2e --out DIR
"""
from __future__ import annotations

import argparse
import gc
import json
import time

import torch


def main() -> int:
    from .gpu_decode import build, new_engine, prompts, run_requests

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=33)
    parser.add_argument("--kinds", default="none,int8")
    args = parser.parse_args()
    model_dir, model = build()
    vocab = model.embed_tokens.weight.shape[0]
    batch = prompts(vocab, args.batch, args.context)
    results = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(), "context": args.context,
               "batch": args.batch, "new_tokens": args.new_tokens, "kinds": {}}
    for kind in args.kinds.split(","):
        engine = new_engine(model_dir, model, kv_gib=40, kv_cold_dtype=kind, kv_hot_window=128,
                            max_model_len=args.context + args.new_tokens + 16)
        r = run_requests(engine, batch, args.new_tokens)
        decode_tokens = args.batch * (args.new_tokens - 1)
        results["kinds"][kind] = {
            "seconds": r["seconds"], "decode_seconds": r["decode_seconds"],
            "decode_tok_s": decode_tokens / r["decode_seconds"],
            "cold_blocks": engine.kv_snapshot().blocks_by_dtype, "mode_after": engine.config.mode,
            "first_tokens": [t[:8] for t in r["tokens"]],
        }
        print(kind, {k: v for k, v in results["kinds"][kind].items() if k != "first_tokens"}, flush=True)
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    with open(f"{args.out}/kv_quant_e2e.json", "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
