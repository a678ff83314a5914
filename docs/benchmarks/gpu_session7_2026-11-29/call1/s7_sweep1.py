"""Session 7 call 1: int8 values converted before the P.V layout change (new) against session 6's kernel (old), 32k x 8."""
import json, sys
import torch, triton
sys.path.insert(0, ".gpu")
import old_cold
from engine.bench.kv_quant_gpu import build_case
from engine.fast_path.triton_attention import choose_num_splits, paged_decode_attention
from engine.fast_path.triton_cold_prefix_attention import cold_prefix_decode_attention
from engine.attention import paged_attention
dev = torch.device("cuda")
splits = choose_num_splits(8, 8, 32768)
q, k, v, cold, meta, cache = build_case("none", 8, 32768, 128, dev)
bf = lambda: paged_decode_attention(q, k, v, meta.block_tables, meta.context_lens, 128**-0.5, splits)
bf16 = triton.testing.do_bench(bf, warmup=25, rep=200, return_mode="median") * 1e3
print("bf16", round(bf16, 1), "splits", splits, flush=True)
res = {"bf16": bf16, "splits": splits}
del q, k, v, cold, meta, cache; torch.cuda.empty_cache()
for kind in ("int8", "int4"):
    q, k, v, cold, meta, cache = build_case(kind, 8, 32768, 128, dev)
    ref = paged_attention(q, k, v, meta, 128**-0.5, cold=cold)
    tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
    cold_blocks = (meta.block_kinds != 0).sum(1).int()
    code = 1 if kind == "int8" else 2
    if kind == "int8":
        variants = [("old", None, None, 64, None, 1, None), ("new", None, None, 64, None, 1, None),
                    ("new", 2, 2, 64, 0, 1, None), ("new", 2, 2, 64, 2, 1, None), ("new", 2, 3, 64, 3, 1, None),
                    ("new", 2, 3, 32, 2, 1, None), ("new", 2, 4, 32, 2, 1, None), ("new", 4, 3, 64, 2, 1, None),
                    ("new", 2, 3, 64, 2, 2, None), ("new", 2, 3, 64, 2, 0.5, None), ("new", 2, 3, 64, 2, 1, 1),
                    ("old", None, None, 64, None, 1, None), ("new", None, None, 64, None, 1, None)]
    else:
        variants = [("old", None, None, 64, None, 1, None), ("new", None, None, 64, None, 1, None)]
    for which, w, s, tile, ta, sm, dots in variants:
        sp = int(splits * sm)
        f = old_cold.cold_prefix_decode_attention if which == "old" else cold_prefix_decode_attention
        fn = lambda: f(q, k, v, cold, tables, slots, cold_blocks, code, meta.context_lens, 128**-0.5, sp,
                       num_warps=w, num_stages=s, tile=tile, tables_ahead=ta, cold_dots=dots)
        name = f"{kind}_{which}_w{w}s{s}t{tile}ta{ta}sp{sp}d{dots}"
        try:
            out = fn()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            us = triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e3
            r = (round(us, 1), round(err, 4), round(bf16 / us, 3))
        except Exception as exc:
            r = type(exc).__name__ + ": " + str(exc)[:200]
        res[name] = r if name not in res else [res[name], r]
        print(name, r, flush=True)
    del q, k, v, cold, meta, cache; torch.cuda.empty_cache()
json.dump(res, open(sys.argv[1], "w"), indent=1)
