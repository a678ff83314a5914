"""bf16 hot and int8 cold decode attention at 32k x 8, with the PDL release after the loop and at exit."""
import os, json, torch, triton
from engine.bench.kv_quant_gpu import build_case
from engine.fast_path.triton_attention import choose_num_splits, paged_decode_attention
from engine.fast_path.triton_cold_prefix_attention import cold_prefix_decode_attention
from engine.kv_cache import KIND_CODE
from engine.attention import paged_attention
dev = torch.device("cuda"); splits = choose_num_splits(8, 8, 32768); res = {}
for kind in ("none", "int8"):
    q, k, v, cold, meta, cache = build_case(kind, 8, 32768, 128, dev)
    ref = paged_attention(q, k, v, meta, 128**-0.5, cold=cold)
    if kind == "none":
        fn = lambda: paged_decode_attention(q, k, v, meta.block_tables, meta.context_lens, 128**-0.5, splits)
    else:
        tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
        cb = (meta.block_kinds != 0).sum(1).int()
        fn = lambda: cold_prefix_decode_attention(q, k, v, cold, tables, slots, cb, KIND_CODE[kind], meta.context_lens, 128**-0.5, splits)
    for rel in ("loop", "exit"):
        os.environ["INFERD_PDL_RELEASE"] = rel
        out = fn(); err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        us = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
        res.setdefault(kind, []).append((rel, round(us, 1), round(err, 4)))
        print(kind, rel, round(us, 1), round(err, 4), flush=True)
    del q, k, v, cold, meta, cache; torch.cuda.empty_cache()
print(json.dumps(res))
