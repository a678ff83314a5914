"""Session 7: int8 cold-prefix variants (modules in .gpu/) against the committed kernel, 32k x 8, interleaved twice."""
import importlib, json, sys
import torch, triton
sys.path.insert(0, ".gpu")
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
q, k, v, cold, meta, cache = build_case("int8", 8, 32768, 128, dev)
ref = paged_attention(q, k, v, meta, 128**-0.5, cold=cold)
tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
cold_blocks = (meta.block_kinds != 0).sum(1).int()
mods = {"main": main_mod}
for name in sys.argv[2].split(","):
    mods[name] = importlib.import_module(name)
for rnd in range(2):
    for name, mod in mods.items():
        fn = lambda: mod.cold_prefix_decode_attention(q, k, v, cold, tables, slots, cold_blocks, 1, meta.context_lens,
                                                      128**-0.5, splits)
        try:
            out = fn()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            us = triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e3
            r = (round(us, 1), round(err, 4))
        except Exception as exc:
            r = type(exc).__name__ + ": " + str(exc)[:200]
        res.setdefault(name, []).append(r)
        print(rnd, name, r, flush=True)
del q, k, v, cold, meta, cache; torch.cuda.empty_cache()
q, k, v, cold, meta, cache = build_case("none", 8, 32768, 128, dev)
res["bf16"].append(triton.testing.do_bench(bf, warmup=25, rep=200, return_mode="median") * 1e3)
print("bf16 again", res["bf16"], flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
