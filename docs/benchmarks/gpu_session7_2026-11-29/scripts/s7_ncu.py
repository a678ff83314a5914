"""Run the int8 cold-prefix kernel (session 7's, or session 6's with 'old') a few times for ncu."""
import sys
import torch
sys.path.insert(0, ".gpu")
import old_cold
from engine.bench.kv_quant_gpu import build_case
from engine.fast_path.triton_attention import choose_num_splits
from engine.fast_path.triton_cold_prefix_attention import cold_prefix_decode_attention
dev = torch.device("cuda")
splits = choose_num_splits(8, 8, 32768)
q, k, v, cold, meta, cache = build_case("int8", 8, 32768, 128, dev)
tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
cold_blocks = (meta.block_kinds != 0).sum(1).int()
f = old_cold.cold_prefix_decode_attention if sys.argv[1] == "old" else cold_prefix_decode_attention
for _ in range(3):
    f(q, k, v, cold, tables, slots, cold_blocks, 1, meta.context_lens, 128**-0.5, splits)
torch.cuda.synchronize()
print("done")
