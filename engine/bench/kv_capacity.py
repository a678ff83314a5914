"""How many sequences of one length fit a KV budget, with and without cold KV.

Runs the engine's own BlockManager (no model): sequences are admitted and prefilled
chunk by chunk, full blocks that leave the hot window are quantized after each chunk,
as the engine does, until the next chunk no longer fits. Page cost includes the cold
kind's scale tables, which the engine pays out of the same budget.
"""

from __future__ import annotations

import argparse

import torch

from ..kv.block_manager import BlockManager
from ..kv.kv_cache import KVShape
from ..request.sampling_params import SamplingParams
from ..request.sequence import Sequence


def sequences_that_fit(
    shape: KVShape, budget_bytes: int, kind: str, seq_len: int, hot_window: int, chunk: int = 256
) -> int:
    cold = () if kind == "none" else (kind,)
    page_cost = shape.page_bytes + sum(shape.scale_bytes_per_page(k) for k in cold)
    bm = BlockManager(
        budget_bytes // page_cost,
        0,
        shape.block_size,
        enable_prefix_caching=False,
        watermark=0.0,
        slots_per_page=shape.slots_per_page(),
    )
    fitted = 0
    while True:
        seq = Sequence(f"s{fitted}", 0, list(range(seq_len)), SamplingParams(), 0, 0.0, 0)
        bm.allocate(seq)
        while seq.num_computed_tokens < seq_len:
            target = min(seq_len, seq.num_computed_tokens + chunk)
            if not bm.can_append(seq, target):
                return fitted
            bm.append_slots(seq, target)
            seq.num_computed_tokens = target
            if kind != "none":
                bm.cool_blocks(seq, hot_window, kind)
        fitted += 1


def capacity_table(shape: KVShape, budget_bytes: int, seq_len: int, hot_window: int) -> dict[str, float]:
    base = sequences_that_fit(shape, budget_bytes, "none", seq_len, hot_window)
    out: dict[str, float] = {"none": base}
    for kind in ("int8", "int4"):
        out[kind] = sequences_that_fit(shape, budget_bytes, kind, seq_len, hot_window)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--hot-window", type=int, default=128)
    args = parser.parse_args()
    cases = {
        "llama3-8b-shape bf16 (GPU)": (KVShape(32, 16, 8, 128, torch.bfloat16), 8 << 30),
        "llama3-8b-shape float32": (KVShape(32, 16, 8, 128, torch.float32), 8 << 30),
        "tiny float32 (CPU tests)": (KVShape(2, 16, 2, 16, torch.float32), 64 << 20),
    }
    print(f"sequences of {args.seq_len} tokens that fit, hot window {args.hot_window}, block 16")
    for name, (shape, budget) in cases.items():
        t = capacity_table(shape, budget, args.seq_len, args.hot_window)
        print(
            f"{name:30s} budget {budget >> 20:6d} MiB: none {t['none']:5d}  int8 {t['int8']:5d} "
            f"({t['int8'] / t['none']:.2f}x)  int4 {t['int4']:5d} ({t['int4'] / t['none']:.2f}x)"
        )


if __name__ == "__main__":
    main()
