"""End-to-end decode with cold KV at long context on a GPU.

The llama3-8b-shape model (random weights drawn on the GPU), 8 requests of 32,768 random
prompt tokens each, all submitted at once, for kv_cold_dtype none, int8 and int4 (hot
window 128). Reports the prefill time, the decode step time once all 8 sequences decode
(median over `--decode-steps` steps, after which the requests are aborted; the engine's
whole step, host work included), the decode tokens/s that gives, and the output
tokens/s of the whole run.
Usage: python -m inferd.engine.bench.kv_quant_e2e --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from ..request.sampling_params import SamplingParams
from .gpu_harness import build, free_dropped_engines, new_engine, prompts, sync


def run_kind(engine, batch_prompts: list[list[int]], decode_steps: int) -> dict:
    n = len(batch_prompts)
    # Long enough that no request ends before the measured steps; aborted after them.
    params = SamplingParams(
        temperature=0.0, max_tokens=engine.max_model_len - len(batch_prompts[0]) - 1, ignore_eos=True
    )
    graphs = engine.runner.fast_decode
    sync()
    start = time.perf_counter()
    for i, p in enumerate(batch_prompts):
        engine.add_request(f"e2e{i}", p, params)
    first: set[str] = set()
    step_s: list[float] = []
    replays_before = graphs.num_replays if graphs is not None else 0
    output_tokens = 0
    prefill_s = None
    while engine.has_unfinished():
        t = time.perf_counter()
        outs = engine.step()
        elapsed = time.perf_counter() - t
        output_tokens += len(outs)
        if prefill_s is not None and engine.last_step.batch_size == n:
            step_s.append(elapsed)
            if len(step_s) == decode_steps:
                for i in range(n):
                    engine.abort(f"e2e{i}")
        first.update(o.request_id for o in outs)
        if prefill_s is None and len(first) == n:
            prefill_s = time.perf_counter() - start
            blocks = engine.kv_snapshot().blocks_by_dtype
    sync()
    total = time.perf_counter() - start
    median = statistics.median(step_s) if step_s else float("nan")
    return {
        "prefill_s": prefill_s,
        "blocks_during_decode": blocks,
        "seconds": total,
        "decode_steps_at_full_batch": len(step_s),
        "decode_step_ms_median": median * 1e3,
        "decode_tok_s": n / median,
        "e2e_output_tok_s": output_tokens / total,
        "graph_replays": (graphs.num_replays - replays_before) if graphs is not None else 0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--kinds", default="none,int8,int4")
    args = parser.parse_args()
    model_dir, model = build()
    vocab = model.embed_tokens.weight.shape[0]
    batch = prompts(vocab, args.batch, args.context)
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "context": args.context,
        "batch": args.batch,
        "kinds": {},
    }
    for kind in args.kinds.split(","):
        t = time.perf_counter()
        engine = new_engine(
            model_dir,
            model,
            kv_gib=40,
            kv_cold_dtype=kind,
            kv_hot_window=128,
            max_model_len=args.context + args.decode_steps + 16,
        )
        started = time.perf_counter() - t
        r = run_kind(engine, batch, args.decode_steps)
        r.update(
            engine_start_s=started,
            mode_after=engine.config.mode,
            fastpath_failures=dict(engine.counters.fastpath_failures),
        )
        results["kinds"][kind] = r
        print(kind, json.dumps(r), flush=True)
        del engine
        free_dropped_engines()
    os.makedirs(args.out, exist_ok=True)
    with open(f"{args.out}/kv_quant_e2e.json", "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
