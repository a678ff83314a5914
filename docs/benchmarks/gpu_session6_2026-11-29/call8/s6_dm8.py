"""Session 6 call 8: dims-major int8 values + base-2 softmax + lazy rescale; timing and an ncu run of the best."""
import json, sys
import torch, triton
from engine.bench.kv_quant_gpu import build_case
from engine.fast_path.triton_attention import choose_num_splits, paged_decode_attention
from engine.fast_path.triton_cold_prefix_attention import cold_prefix_decode_attention
from engine.attention import paged_attention
dev = torch.device("cuda")
NCU = len(sys.argv) > 2 and sys.argv[2] == "ncu"
splits = choose_num_splits(8, 8, 32768)
res = {}
if not NCU:
    q, k, v, cold, meta, cache = build_case("none", 8, 32768, 128, dev)
    bf16 = triton.testing.do_bench(lambda: paged_decode_attention(q, k, v, meta.block_tables, meta.context_lens, 128**-0.5, splits), warmup=25, rep=200, return_mode="median") * 1e3
    print("bf16", round(bf16, 1), flush=True)
    res["bf16"] = bf16
    del q, k, v, cold, meta, cache; torch.cuda.empty_cache()
q, k, v, cold, meta, cache = build_case("int8", 8, 32768, 128, dev)
ref = paged_attention(q, k, v, meta, 128**-0.5, cold=cold)
tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
cold_blocks = (meta.block_kinds != 0).sum(1).int()
variants = [(2, 3, 64, 1, 1, 1, 2, 1), (2, 3, 64, 1, 1, 1, 2, 2), (2, 3, 32, 1, 1, 1, 2, 1), (2, 3, 64, 1, 0, 0, 2, 1),
            (2, 3, 64, 1, 1, 1, 3, 1), (2, 2, 64, 1, 1, 1, 2, 1), (4, 3, 64, 1, 1, 1, 2, 1), (4, 3, 128, 1, 1, 1, 2, 1)]
if NCU:
    variants = variants[:1]
for w, s, tile, ta, l2, lazy, dots, sm in variants:
    sp = int(splits * sm)
    fn = lambda: cold_prefix_decode_attention(q, k, v, cold, tables, slots, cold_blocks, 1, meta.context_lens, 128**-0.5, sp,
                                              num_warps=w, num_stages=s, tile=tile, tables_ahead=bool(ta),
                                              log2_softmax=bool(l2), lazy_rescale=bool(lazy), cold_dots=dots)
    if NCU:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        break
    name = f"w{w}s{s}t{tile}ta{ta}l2{l2}lazy{lazy}d{dots}sp{sp}"
    try:
        out = fn()
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        us = triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e3
        res[name] = (round(us, 1), round(err, 4), round(res["bf16"] / us, 3))
    except Exception as exc:
        res[name] = type(exc).__name__ + ": " + str(exc)[:200]
    print(name, res[name], flush=True)
if not NCU:
    json.dump(res, open(sys.argv[1], "w"), indent=1)
