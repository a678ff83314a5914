"""Session 7: int4 in the fast loop (main, and v4k with keys converted where loaded too) against session 6's kernel, 32k x 8."""
import json, sys
import torch, triton
sys.path.insert(0, ".gpu")
import old_cold, v4k
from engine.bench.kv_quant_gpu import build_case
from engine.fast_path.triton_attention import choose_num_splits, paged_decode_attention
from engine.fast_path import triton_cold_prefix_attention as main_mod
from engine.attention import paged_attention
dev = torch.device("cuda")
splits = choose_num_splits(8, 8, 32768)
q, k, v, cold, meta, cache = build_case("none", 8, 32768, 128, dev)
bf = lambda: paged_decode_attention(q, k, v, meta.block_tables, meta.context_lens, 128**-0.5, splits)
res = {"bf16": [triton.testing.do_bench(bf, warmup=25, rep=200, return_mode="median") * 1e3]}
print("bf16", res["bf16"], flush=True)
del q, k, v, cold, meta, cache; torch.cuda.empty_cache()
mods = {"main": main_mod, "old": old_cold, "v4k": v4k}
plan = {"int8": [("main", None, None, None), ("old", None, None, None)],
        "int4": [("old", None, None, None), ("main", None, None, None), ("main", 2, 3, 2), ("main", 2, 2, 2),
                 ("v4k", 2, 2, 0), ("v4k", 2, 3, 2), ("main", 4, 2, 0)]}
for kind, variants in plan.items():
    q, k, v, cold, meta, cache = build_case(kind, 8, 32768, 128, dev)
    ref = paged_attention(q, k, v, meta, 128**-0.5, cold=cold)
    tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
    cold_blocks = (meta.block_kinds != 0).sum(1).int()
    code = 1 if kind == "int8" else 2
    for rnd in range(2):
        for name, w, s, ta in variants:
            mod = mods[name]
            fn = lambda: mod.cold_prefix_decode_attention(q, k, v, cold, tables, slots, cold_blocks, code, meta.context_lens,
                                                          128**-0.5, splits, num_warps=w, num_stages=s, tables_ahead=ta)
            key = f"{kind}_{name}_w{w}s{s}ta{ta}"
            try:
                out = fn()
                err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                us = triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e3
                r = (round(us, 1), round(err, 4))
            except Exception as exc:
                r = type(exc).__name__ + ": " + str(exc)[:200]
            res.setdefault(key, []).append(r)
            print(rnd, key, r, flush=True)
    del q, k, v, cold, meta, cache; torch.cuda.empty_cache()
json.dump(res, open(sys.argv[1], "w"), indent=1)
