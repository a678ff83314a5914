"""Session 6 call 5: token-major int8/int4 cold-prefix kernel, tables 2 or 3 tiles ahead, register caps, at 32k x 8."""
import json, sys
import torch, triton
from engine.bench.kv_quant_gpu import build_case
from engine.fast_path.triton_attention import choose_num_splits, paged_decode_attention
from engine.fast_path.triton_cold_prefix_attention import cold_prefix_decode_attention
from engine.kv_cache import KIND_CODE
from engine.attention import paged_attention
dev = torch.device("cuda")
splits = choose_num_splits(8, 8, 32768)
q, k, v, cold, meta, cache = build_case("none", 8, 32768, 128, dev)
bf16 = triton.testing.do_bench(lambda: paged_decode_attention(q, k, v, meta.block_tables, meta.context_lens, 128**-0.5, splits), warmup=25, rep=200, return_mode="median") * 1e3
print("bf16", round(bf16, 1), flush=True)
res = {"bf16": bf16, "splits": splits}
del q, k, v, cold, meta, cache; torch.cuda.empty_cache()
shapes = {"int8": [(2, 2, 0, 0), (2, 3, 2, 0), (2, 3, 3, 0), (2, 3, 2, 200), (2, 3, 3, 200), (2, 3, 3, 216), (2, 3, 3, 184),
                   (2, 2, 2, 200), (2, 3, 2, 0)],
          "int4": [(2, 2, 0, 0), (2, 3, 2, 0), (2, 3, 3, 0), (2, 3, 3, 200), (2, 2, 2, 0)]}
for kind in ("int8", "int4"):
    q, k, v, cold, meta, cache = build_case(kind, 8, 32768, 128, dev)
    ref = paged_attention(q, k, v, meta, 128**-0.5, cold=cold)
    tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
    cold_blocks = (meta.block_kinds != 0).sum(1).int()
    for i, (w, s, ta, mr) in enumerate(shapes[kind]):
        fn = lambda: cold_prefix_decode_attention(q, k, v, cold, tables, slots, cold_blocks, KIND_CODE[kind],
                                                  meta.context_lens, 128**-0.5, splits, num_warps=w, num_stages=s,
                                                  tables_ahead=ta, max_registers=mr or None)
        name = f"{kind}_w{w}s{s}ta{ta}r{mr}#{i}"
        try:
            out = fn()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            us = triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e3
            res[name] = (round(us, 1), round(err, 4), round(bf16 / us, 3))
        except Exception as exc:
            res[name] = type(exc).__name__ + ": " + str(exc)[:160]
        print(name, res[name], flush=True)
    del q, k, v, cold, meta, cache; torch.cuda.empty_cache()
json.dump(res, open(sys.argv[1], "w"), indent=1)
