"""Deterministic mode's matrix product on the GPU (fast_path/invariant_matmul.py): for the
llama3-8b-shape projections, which launch shapes give bitwise the same rows whatever the
number of rows, and how fast each runs.

For every weight shape and K split (up to 2 parts for the wide weights, whose outputs
alone fill the GPU): the rows of 1 and 32-row products, at every block_n, against the
same rows of one 8,192-row product (bitwise), the largest difference to the unsplit
product; then the time of 1 to 256 rows at each block_n
(replays of a CUDA graph that runs the product over `--copies` distinct weights, so
they come from HBM, not L2), and of 8,192 rows (a prefill step) at `block_n_for`'s.
One JSON line per measurement, also written to --out/invariant_sweep.jsonl.

    python -m inferd.engine.bench.invariant_sweep --out results/
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ..fast_path.invariant_matmul import block_n_for, invariant_linear, split_k_for
from .gemv_sweep import SHAPES, json_recorder, time_graph
from .gpu_harness import measure_ceilings, time_cuda

SPLITS = (1, 2, 4, 8)
BLOCK_NS = (16, 32, 64, 128)
ROWS = (1, 8, 32, 64, 128, 256)
PREFILL_ROWS = 8192


def bitwise_checks(x: torch.Tensor, weight: torch.Tensor, split_k: int) -> tuple[int, int]:
    """(checks, of which equal): rows of 1 and 32-row products at every block_n against
    the same rows of the PREFILL_ROWS-row product."""
    full = invariant_linear(x, weight, split_k=split_k)
    checks = [
        torch.equal(invariant_linear(x[:rows], weight, split_k=split_k, block_n=block_n), full[:rows])
        for rows in (1, 32)
        for block_n in BLOCK_NS
    ]
    return len(checks), sum(checks)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--copies", type=int, default=8, help="distinct weight tensors per timing (at most 200 MB)")
    parser.add_argument("--replays", type=int, default=15)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("invariant_sweep needs a CUDA GPU (torch.cuda.is_available() is False)")
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    record = json_recorder(results)
    torch.manual_seed(0)
    copy_rate = measure_ceilings(torch.device("cuda"))["copy_bytes_per_s"]
    record(kind="copy", bytes_per_s=copy_rate)
    for name, (n, k, _) in SHAPES.items():
        copies = max(1, min(args.copies, (200 << 20) // (n * k * 2)))
        weights = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * k**-0.5 for _ in range(copies)]
        x = torch.randn(PREFILL_ROWS, k, dtype=torch.bfloat16, device="cuda")
        unsplit = invariant_linear(x[:32], weights[0], split_k=1).float()
        for split_k in SPLITS:
            if (split_k > 1 and k // split_k < 512) or (split_k > 2 and n > 8192):
                continue
            checks, equal = bitwise_checks(x, weights[0], split_k)
            diff = (invariant_linear(x[:32], weights[0], split_k=split_k).float() - unsplit).abs().max().item()
            chosen = split_k == split_k_for(n, k)
            record(
                kind="bitwise",
                shape=name,
                split_k=split_k,
                chosen=chosen,
                checks=checks,
                equal=equal,
                max_diff_vs_unsplit=diff,
            )
            for rows in ROWS:
                xs = x[:rows].contiguous()
                for block_n in BLOCK_NS:
                    seconds = (
                        time_graph(
                            lambda: [invariant_linear(xs, w, split_k=split_k, block_n=block_n) for w in weights],
                            args.replays,
                        )
                        / copies
                    )
                    record(
                        kind="rows",
                        shape=name,
                        split_k=split_k,
                        chosen=chosen,
                        rows=rows,
                        block_n=block_n,
                        rule=block_n == block_n_for(rows, n, k),
                        us=seconds * 1e6,
                        of_copy=n * k * 2 / seconds / copy_rate,
                    )
            seconds = time_cuda(lambda: invariant_linear(x, weights[0], split_k=split_k), repeat=5, warmup=1)
            record(
                kind="prefill",
                shape=name,
                split_k=split_k,
                chosen=chosen,
                rows=PREFILL_ROWS,
                block_n=block_n_for(PREFILL_ROWS, n, k),
                us=seconds * 1e6,
                tflop_s=2 * PREFILL_ROWS * n * k / seconds / 1e12,
            )
    (args.out / "invariant_sweep.jsonl").write_text("".join(json.dumps(row) + "\n" for row in results))


if __name__ == "__main__":
    main()
