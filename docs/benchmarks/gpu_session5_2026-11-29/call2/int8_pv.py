"""int8 cold-prefix kernel at 32k x 8 (dims-major values): keys-only int8 dots (2) against int8 P.V too (3)."""
import json
import torch, triton
from engine.bench.kv_quant_gpu import build_case
from engine.fast_path.triton_attention import choose_num_splits, paged_decode_attention
from engine.fast_path.triton_cold_prefix_attention import cold_prefix_decode_attention
from engine.kv_cache import KIND_CODE
from engine.attention import paged_attention

dev = torch.device("cuda")
splits = choose_num_splits(8, 8, 32768)
res = {"splits": splits}
q, k, v, cold, meta, cache = build_case("none", 8, 32768, 128, dev)
res["bf16_hot"] = triton.testing.do_bench(lambda: paged_decode_attention(q, k, v, meta.block_tables, meta.context_lens, 128**-0.5, splits), warmup=25, rep=200, return_mode="median") * 1e3
print("bf16", res["bf16_hot"], flush=True)
del q, k, v, cold, meta, cache; torch.cuda.empty_cache()
q, k, v, cold, meta, cache = build_case("int8", 8, 32768, 128, dev)
ref = paged_attention(q, k, v, meta, 128**-0.5, cold=cold)
tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
cold_blocks = (meta.block_kinds != 0).sum(1).int()
for w, s, t, sp, dots in [(2, 2, 64, splits, 2), (2, 2, 64, splits, 3), (4, 2, 64, splits, 3), (4, 3, 64, splits, 3),
                          (4, 2, 128, splits, 3), (2, 3, 64, splits, 3), (4, 4, 64, splits, 3), (8, 2, 128, splits, 3),
                          (4, 2, 64, splits * 2, 3), (4, 2, 128, splits // 2, 3), (2, 1, 64, splits, 3), (4, 2, 64, splits, 2),
                          (4, 3, 128, splits, 3)]:
    fn = lambda: cold_prefix_decode_attention(q, k, v, cold, tables, slots, cold_blocks, KIND_CODE["int8"],
                                              meta.context_lens, 128**-0.5, sp, num_warps=w, num_stages=s, tile=t, cold_dots=dots)
    name = f"int8_w{w}s{s}t{t}sp{sp}d{dots}"
    try:
        out = fn()
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        us = triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e3
        res[name] = (round(us, 1), round(err, 4), round(res["bf16_hot"] / us, 3))
    except Exception as exc:
        res[name] = type(exc).__name__ + ": " + str(exc)[:160]
    print(name, res[name], flush=True)
print(json.dumps(res))
