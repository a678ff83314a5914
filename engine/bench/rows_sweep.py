"""Few-row product launch-shape sweep on the GPU: the Triton row kernels (triton_rows.py)
against cuBLAS (F.linear) on the llama3-8b-shape projections at 2-64 rows, in GB/s of
weights read.

Rows 2-16 share one kernel (BLOCK_M 16), so the sweep runs at 16, 32 and 64 rows and
cuBLAS at every rung of the graph ladder. The gate/up shape is timed as the decoder
runs it, with SiLU-and-multiply as the epilogue, against cuBLAS then silu_and_mul. Each timing replays a CUDA graph of the
product over distinct weight tensors (gemv_sweep.time_graph), so weights come from
HBM. With --split-k, launch shapes that split K over that many programs per tile
(a smaller grid of them) are swept too, and the engine's current shape is timed first
for reference. Prints one JSON line per measurement and writes them to --out.

    python -m inferd.engine.bench.rows_sweep --out results/ [--split-k 1,2,4]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..fast_path.fused_ops import silu_and_mul
from ..fast_path.triton_rows import RowsConfig, block_rows, choose_config, rows_gemm
from .gemv_sweep import SHAPES, json_recorder, time_graph
from .gpu_harness import measure_ceilings

CUBLAS_ROWS = (2, 4, 8, 16, 32, 64)
SWEEP_ROWS = (16, 32, 64)  # one per BLOCK_M
# 8 warps lost to 4 in every case of a first sweep; 128 columns only in a few shapes
CONFIGS = [RowsConfig(bn, bk, 4, s) for bn, bk, s in itertools.product((16, 32, 64), (64, 128, 256), (3, 4, 5))] + [
    RowsConfig(128, 64, 4, 4),
    RowsConfig(128, 128, 4, 3),
    RowsConfig(64, 128, 8, 4),
]


def split_configs(split_k: int) -> list[RowsConfig]:
    """The launch shapes swept at `split_k` programs per tile (all of CONFIGS unsplit)."""
    if split_k == 1:
        return CONFIGS
    return [RowsConfig(bn, bk, 4, 4, split_k) for bn, bk in itertools.product((16, 32, 64), (64, 128, 256))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--copies", type=int, default=16, help="distinct weight tensors per timing")
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop sweeping after this long")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated shapes of gemv_sweep.SHAPES")
    parser.add_argument("--split-k", default="1", help="comma-separated split counts to sweep (powers of two)")
    args = parser.parse_args(argv)
    configs = [c for split in args.split_k.split(",") for c in split_configs(int(split))]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: list[dict] = []
    record = json_recorder(results)

    torch.manual_seed(0)
    dtype = torch.bfloat16
    copy_rate = measure_ceilings(torch.device("cuda"))["copy_bytes_per_s"]
    record(kind="copy", bytes_per_s=copy_rate)
    best_configs = []
    for name in args.shapes.split(","):
        n, k, fused = SHAPES[name]
        silu = fused == "norm_silu"
        copies = max(2, min(args.copies, int(4e9 // (n * k * 2))))
        weights = [torch.randn(n, k, dtype=dtype, device="cuda") * k**-0.5 for _ in range(copies)]
        nbytes = n * k * 2 * copies

        def of_copy(seconds):
            return nbytes / seconds / copy_rate

        def cublas_product(x, w):
            out = F.linear(x, w)
            return silu_and_mul(out) if silu else out

        cublas = {}
        for m in CUBLAS_ROWS:
            x = torch.randn(m, k, dtype=dtype, device="cuda")
            cublas[m] = time_graph(lambda: [cublas_product(x, w) for w in weights], args.replays)
            record(kind="cublas", shape=name, rows=m, us=cublas[m] / copies * 1e6, of_copy=of_copy(cublas[m]))
        for m in SWEEP_ROWS:
            x = torch.randn(m, k, dtype=dtype, device="cuda")
            ranked = []
            current = choose_config(n, k, m)
            for config in [current] + [c for c in configs if c != current] if current else configs:
                if k % (config.block_k * config.split_k) or time.perf_counter() - started > args.budget_s:
                    continue
                try:
                    seconds = time_graph(
                        lambda: [rows_gemm(x, w, silu_mul=silu, config=config) for w in weights], args.replays
                    )
                except Exception as exc:  # a launch shape the compiler rejects is skipped, and said
                    record(kind="rows", shape=name, rows=m, config=str(config), error=repr(exc)[:200])
                    continue
                ranked.append((seconds, config))
                record(
                    kind="rows",
                    shape=name,
                    rows=m,
                    config=str(config),
                    current=config == current,
                    us=seconds / copies * 1e6,
                    of_copy=of_copy(seconds),
                    vs_cublas=cublas[m] / seconds,
                )
            if not ranked:
                continue
            ranked.sort(key=lambda item: item[0])
            seconds, best = ranked[0]
            ref = cublas_product(x, weights[0]).float()
            got = rows_gemm(x, weights[0], silu_mul=silu, config=best).float()
            row = dict(
                kind="best",
                shape=name,
                rows=m,
                n=n,
                k=k,
                block_m=block_rows(m),
                config=str(best),
                block_n=best.block_n,
                block_k=best.block_k,
                num_warps=best.num_warps,
                num_stages=best.num_stages,
                split_k=best.split_k,
                of_copy=of_copy(seconds),
                vs_cublas=cublas[m] / seconds,
                rel_err_vs_cublas=((got - ref).norm() / ref.norm()).item(),
            )
            record(**row)
            best_configs.append(row)
        weights = []  # drop this shape's copies before the next one's
        torch.cuda.empty_cache()
    (args.out / "best_configs.json").write_text(json.dumps(best_configs, indent=1))
    (args.out / "rows_sweep.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
