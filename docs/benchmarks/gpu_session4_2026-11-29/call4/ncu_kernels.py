"""Run each kernel of interest a few times for ncu: bf16 hot decode attention and int8 cold
attention at 32k x 8, and the batch-1 GEMVs (o plain, q/k/v with the RMSNorm folded in)."""
import torch
from engine.bench.kv_quant_gpu import build_case
from engine.fast_path.triton_attention import choose_num_splits, paged_decode_attention
from engine.fast_path.triton_cold_prefix_attention import cold_prefix_decode_attention
from engine.fast_path.triton_gemv import gemv, rms_norm_gemv
from engine.kv_cache import KIND_CODE

dev = torch.device("cuda")
splits = choose_num_splits(8, 8, 32768)
for kind in ("none", "int8"):
    q, k, v, cold, meta, cache = build_case(kind, 8, 32768, 128, dev)
    if kind == "none":
        fn = lambda: paged_decode_attention(q, k, v, meta.block_tables, meta.context_lens, 128**-0.5, splits)
    else:
        tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
        cold_blocks = (meta.block_kinds != 0).sum(1).int()
        fn = lambda: cold_prefix_decode_attention(q, k, v, cold, tables, slots, cold_blocks, KIND_CODE[kind],
                                                  meta.context_lens, 128**-0.5, splits)
    for _ in range(4):
        fn()
    torch.cuda.synchronize()
    del q, k, v, cold, meta, cache
    torch.cuda.empty_cache()
x, res = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16), torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
g = torch.rand(4096, device=dev, dtype=torch.bfloat16) + 0.5
w_o = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
w_qkv = torch.randn(6144, 4096, device=dev, dtype=torch.bfloat16)
w_gu = torch.randn(28672, 4096, device=dev, dtype=torch.bfloat16)
for _ in range(4):
    gemv(x, w_o)
    rms_norm_gemv(x, res, g, 1e-5, w_qkv)
    rms_norm_gemv(x, res, g, 1e-5, w_gu, silu_mul=True)
torch.cuda.synchronize()
print("done")
