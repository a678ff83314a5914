"""Run the int8 cold-prefix kernel (old default, then tables ahead with 3 stages) a few times for ncu."""
import torch
from engine.bench.kv_quant_gpu import build_case
from engine.fast_path.triton_attention import choose_num_splits
from engine.fast_path.triton_cold_prefix_attention import cold_prefix_decode_attention
dev = torch.device("cuda")
splits = choose_num_splits(8, 8, 32768)
q, k, v, cold, meta, cache = build_case("int8", 8, 32768, 128, dev)
tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
cold_blocks = (meta.block_kinds != 0).sum(1).int()
for stages, ahead in ((2, False), (3, True)):
    for _ in range(3):
        cold_prefix_decode_attention(q, k, v, cold, tables, slots, cold_blocks, 1, meta.context_lens, 128**-0.5, splits,
                                     num_stages=stages, tables_ahead=ahead)
torch.cuda.synchronize()
print("done")
