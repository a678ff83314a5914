"""Time the int8 cold-prefix kernel (cold_dots=2) at 32k x 8 over launch shapes with smaller
per-program footprints (occupancy: ncu showed 255 registers, 4 blocks x 2 warps per SM)."""
import json, sys
import torch, triton
from engine.bench.kv_quant_gpu import build_case
from engine.fast_path.triton_attention import choose_num_splits, paged_decode_attention
from engine.fast_path.triton_cold_prefix_attention import cold_prefix_decode_attention
from engine.kv_cache import KIND_CODE
from engine.attention import paged_attention

dev = torch.device("cuda")
splits = choose_num_splits(8, 8, 32768)
res = {}
q, k, v, cold, meta, cache = build_case("none", 8, 32768, 128, dev)
res["bf16_hot"] = triton.testing.do_bench(lambda: paged_decode_attention(q, k, v, meta.block_tables, meta.context_lens, 128**-0.5, splits), warmup=25, rep=200, return_mode="median") * 1e3
del q, k, v, cold, meta, cache; torch.cuda.empty_cache()
for kind in ("int8", "int4"):
    q, k, v, cold, meta, cache = build_case(kind, 8, 32768, 128, dev)
    ref = paged_attention(q, k, v, meta, 128**-0.5, cold=cold)
    tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
    cold_blocks = (meta.block_kinds != 0).sum(1).int()
    for w, s, t, sp in ((2, 2, 64, splits), (2, 2, 32, splits), (2, 3, 32, splits), (2, 4, 32, splits), (4, 2, 32, splits),
                        (4, 3, 32, splits), (2, 1, 64, splits), (2, 3, 64, splits), (2, 2, 32, 2 * splits),
                        (4, 2, 32, 2 * splits), (2, 2, 16, splits), (4, 2, 16, splits), (8, 2, 32, splits)):
        fn = lambda: cold_prefix_decode_attention(q, k, v, cold, tables, slots, cold_blocks, KIND_CODE[kind],
                                                  meta.context_lens, 128**-0.5, sp, num_warps=w, num_stages=s, tile=t)
        name = f"{kind}_w{w}s{s}t{t}sp{sp}"
        try:
            out = fn()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            res[name] = (round(triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e3, 1), round(err, 4))
        except Exception as exc:
            res[name] = type(exc).__name__ + ": " + str(exc)[:80]
        print(name, res[name], flush=True)
    del q, k, v, cold, meta, cache; torch.cuda.empty_cache()
print(json.dumps(res))
