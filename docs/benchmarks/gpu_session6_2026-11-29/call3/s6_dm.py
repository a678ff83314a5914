"""Session 6 call 3: dims-major int8 kernel variants (PTX conversion on/off, stages, tables ahead) at 32k x 8."""
import json, sys
import torch, triton
from engine.bench.kv_quant_gpu import build_case
from engine.fast_path.triton_attention import choose_num_splits
from engine.fast_path.triton_cold_prefix_attention import cold_prefix_decode_attention
from engine.attention import paged_attention
dev = torch.device("cuda")
splits = choose_num_splits(8, 8, 32768)
q, k, v, cold, meta, cache = build_case("int8", 8, 32768, 128, dev)
ref = paged_attention(q, k, v, meta, 128**-0.5, cold=cold)
tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
cold_blocks = (meta.block_kinds != 0).sum(1).int()
res = {}
NCU = len(sys.argv) > 1 and sys.argv[1] == "ncu"
for w, s, ta, ptx, dots in [(2, 3, 1, 1, 2), (2, 3, 1, 0, 2), (2, 2, 1, 0, 2), (2, 2, 0, 0, 2), (2, 3, 1, 1, 1), (2, 3, 1, 0, 1), (2, 3, 1, 0, 0)]:
    if NCU:
        break
    fn = lambda: cold_prefix_decode_attention(q, k, v, cold, tables, slots, cold_blocks, 1, meta.context_lens, 128**-0.5,
                                              splits, num_warps=w, num_stages=s, tables_ahead=bool(ta), ptx=bool(ptx), cold_dots=dots)
    out = fn()
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    name = f"w{w}s{s}ta{ta}ptx{ptx}d{dots}"
    res[name] = (round(triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e3, 1), round(err, 4))
    print(name, res[name], flush=True)
if NCU:
    for _ in range(3):
        cold_prefix_decode_attention(q, k, v, cold, tables, slots, cold_blocks, 1, meta.context_lens, 128**-0.5, splits,
                                     num_stages=3, tables_ahead=True)
    torch.cuda.synchronize()
