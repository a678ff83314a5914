"""Session 6: cold-prefix kernel at 32k x 8 with table entries read two tiles ahead (TABLES_AHEAD), stages, tiles."""
import json, sys, time
import torch, triton
from engine.bench.kv_quant_gpu import build_case
from engine.fast_path.triton_attention import choose_num_splits, paged_decode_attention
from engine.fast_path.triton_cold_prefix_attention import cold_prefix_decode_attention
from engine.kv_cache import KIND_CODE
from engine.attention import paged_attention

dev = torch.device("cuda")
splits = choose_num_splits(8, 8, 32768)
src = torch.empty(1 << 30, dtype=torch.uint8, device=dev); dst = torch.empty_like(src)
copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
res = {"splits": splits, "copy_TBps": 2 * src.numel() / (copy_ms / 1e3) / 1e12, "triton": triton.__version__, "torch": torch.__version__}
del src, dst; torch.cuda.empty_cache()
print("copy TB/s", round(res["copy_TBps"], 3), flush=True)
q, k, v, cold, meta, cache = build_case("none", 8, 32768, 128, dev)
res["bf16_hot"] = triton.testing.do_bench(lambda: paged_decode_attention(q, k, v, meta.block_tables, meta.context_lens, 128**-0.5, splits), warmup=25, rep=200, return_mode="median") * 1e3
print("bf16", round(res["bf16_hot"], 1), flush=True)
del q, k, v, cold, meta, cache; torch.cuda.empty_cache()
int8_shapes = [(2, 2, 64, 0, 1), (2, 2, 64, 1, 1), (2, 3, 64, 1, 1), (2, 3, 64, 0, 1), (2, 3, 32, 1, 1), (4, 3, 64, 1, 1),
               (4, 3, 128, 1, 1), (2, 3, 128, 1, 1), (2, 3, 64, 1, 2), (2, 3, 64, 1, 0.5), (2, 2, 128, 1, 1)]
int4_shapes = [(2, 2, 64, 0, 1), (2, 2, 64, 1, 1), (2, 3, 64, 1, 1), (2, 3, 32, 1, 1), (4, 3, 64, 1, 1)]
for kind, shapes in (("int8", int8_shapes), ("int4", int4_shapes)):
    q, k, v, cold, meta, cache = build_case(kind, 8, 32768, 128, dev)
    ref = paged_attention(q, k, v, meta, 128**-0.5, cold=cold)
    tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
    cold_blocks = (meta.block_kinds != 0).sum(1).int()
    for w, s, t, ta, sm in shapes:
        sp = int(splits * sm)
        fn = lambda: cold_prefix_decode_attention(q, k, v, cold, tables, slots, cold_blocks, KIND_CODE[kind],
                                                  meta.context_lens, 128**-0.5, sp, num_warps=w, num_stages=s, tile=t,
                                                  tables_ahead=bool(ta))
        name = f"{kind}_w{w}s{s}t{t}ta{ta}sp{sp}"
        try:
            out = fn()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            us = triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e3
            res[name] = (round(us, 1), round(err, 4), round(res["bf16_hot"] / us, 3))
        except Exception as exc:
            res[name] = type(exc).__name__ + ": " + str(exc)[:160]
        print(name, res[name], flush=True)
    del q, k, v, cold, meta, cache; torch.cuda.empty_cache()
json.dump(res, open(sys.argv[1], "w"), indent=1)
