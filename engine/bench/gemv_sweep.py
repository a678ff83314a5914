"""Batch-1 GEMV launch-shape sweep on the GPU: our Triton GEMVs (triton_gemv.py) against
cuBLAS (F.linear) on the llama3-8b-shape projections, in GB/s of weights read.

Each timing replays a CUDA graph that runs the product over `--copies` distinct weight
tensors in turn (as the layers of a model do), so the weights come from HBM, not from
the 50 MB L2. Prints one JSON line per measurement and writes them to --out.

    python -m inferd.engine.bench.gemv_sweep --out results/
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..fast_path.fused_ops import add_rms_norm, silu_and_mul
from ..fast_path.triton_gemv import GemvConfig, gemv, rms_norm_gemv
from .gpu_decode import pdl_setting
from .gpu_harness import measure_ceilings, time_cuda

# name: (N, K, fused op) of llama3-8b-shape: q/k/v fused, o, gate/up fused, down, lm_head.
SHAPES = {
    "qkv": (6144, 4096, "norm"),
    "o": (4096, 4096, None),
    "gate_up": (28672, 4096, "norm_silu"),
    "down": (4096, 14336, None),
    "lm_head": (128256, 4096, "norm"),
}
CONFIGS = [
    GemvConfig(bn, bk, w, s)
    for bn, bk, w, s in itertools.product((2, 4, 8, 16), (256, 512, 1024), (4, 8), (1, 3))
    if 1024 <= bn * bk <= 16384
]


def json_recorder(results: list[dict]):
    """The sweeps' `record(**row)`: keeps the row in `results` and prints it as one JSON line."""

    def record(**row):
        results.append(row)
        print(json.dumps(row), flush=True)

    return record


def time_graph(fn, replays: int) -> float:
    """Seconds per replay of a CUDA graph of `fn` (captured after one warm call)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_cuda(graph.replay, repeat=replays, warmup=1)


def layer_chain(record, copy_rate: float, replays: int, layers: int = 32) -> None:
    """The projections, norms and lm_head of `layers` decoder layers at batch 1 (no
    attention): the unfused chain (cuBLAS + fused_ops) against the fused GEMVs, these
    with and without programmatic dependent launch; alternated."""
    dtype, eps, hidden = torch.bfloat16, 1e-5, 4096
    torch.manual_seed(1)
    ws = [
        {
            name: torch.randn(n, k, dtype=dtype, device="cuda") * k**-0.5
            for name, (n, k, _) in SHAPES.items()
            if name != "lm_head"
        }
        for _ in range(layers)
    ]
    lm_head = torch.randn(*SHAPES["lm_head"][:2], dtype=dtype, device="cuda") * hidden**-0.5
    norms = [torch.rand(hidden, dtype=dtype, device="cuda") + 0.5 for _ in range(3)]
    x0 = torch.randn(1, hidden, dtype=dtype, device="cuda")
    attn = torch.randn(1, hidden, dtype=dtype, device="cuda")  # stands in for the attention output
    nbytes = sum(w.numel() * 2 for layer in ws for w in layer.values()) + lm_head.numel() * 2

    def unfused():
        x, residual = x0, x0.clone()
        for w in ws:
            h, residual = add_rms_norm(x, residual, norms[0], eps)
            F.linear(h, w["qkv"])
            x = F.linear(attn, w["o"])
            h, residual = add_rms_norm(x, residual, norms[1], eps)
            x = F.linear(silu_and_mul(F.linear(h, w["gate_up"])), w["down"])
        h, _ = add_rms_norm(x, residual, norms[2], eps)
        F.linear(h, lm_head).float()

    def fused():  # each product at choose_config's launch shape, as the decoder runs it
        x, residual = x0, None
        for w in ws:
            _, residual = rms_norm_gemv(x, residual, norms[0], eps, w["qkv"])
            x = gemv(attn, w["o"])
            act, residual = rms_norm_gemv(x, residual, norms[1], eps, w["gate_up"], silu_mul=True)
            x = gemv(act, w["down"])
        rms_norm_gemv(x, residual, norms[2], eps, lm_head, out_dtype=torch.float32)

    variants = [("unfused", unfused, "0"), ("gemv_no_pdl", fused, "0"), ("gemv_pdl", fused, "1")]
    times: dict[str, list[float]] = {}
    for _ in range(2):
        for label, fn, pdl in variants:
            with pdl_setting(pdl):
                times.setdefault(label, []).append(time_graph(fn, replays))
    for label, seconds in times.items():
        best = min(seconds)
        record(
            kind="layers",
            variant=label,
            layers=layers,
            ms=best * 1e3,
            all_ms=[t * 1e3 for t in seconds],
            bytes_per_s=nbytes / best,
            of_copy=nbytes / best / copy_rate,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--copies", type=int, default=16, help="distinct weight tensors per timing")
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop sweeping after this long")
    parser.add_argument("--chain-only", action="store_true", help="skip the sweep: only the 32-layer chain")
    parser.add_argument(
        "--fused-sweep", action="store_true", help="sweep every launch shape of the fused (RMSNorm / SiLU) variants too"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: list[dict] = []
    record = json_recorder(results)

    torch.manual_seed(0)
    dtype, eps = torch.bfloat16, 1e-5
    copy_rate = measure_ceilings(torch.device("cuda"))["copy_bytes_per_s"]  # as gpu_decode's MBU
    record(kind="copy", bytes_per_s=copy_rate)
    shapes = () if args.chain_only else SHAPES.items()
    for name, (n, k, fused) in shapes:
        copies = max(2, min(args.copies, int(4e9 // (n * k * 2))))
        weights = [torch.randn(n, k, dtype=dtype, device="cuda") * k**-0.5 for _ in range(copies)]
        nbytes = n * k * 2 * copies
        x = torch.randn(1, k, dtype=dtype, device="cuda")
        residual = torch.randn(1, k, dtype=dtype, device="cuda")
        norm = torch.rand(k, dtype=dtype, device="cuda") + 0.5

        def rate(seconds):
            return nbytes / seconds

        cublas = time_graph(lambda: [F.linear(x, w) for w in weights], args.replays)
        record(
            kind="cublas",
            shape=name,
            us=cublas / copies * 1e6,
            bytes_per_s=rate(cublas),
            of_copy=rate(cublas) / copy_rate,
        )
        ranked = []
        for config in CONFIGS:
            if k % config.block_k or time.perf_counter() - started > args.budget_s:
                continue
            try:
                seconds = time_graph(lambda: [gemv(x, w, config=config) for w in weights], args.replays)
            except Exception as exc:  # a launch shape the compiler rejects is skipped, and said
                record(kind="gemv", shape=name, config=str(config), error=repr(exc)[:200])
                continue
            ranked.append((seconds, config))
            record(
                kind="gemv",
                shape=name,
                config=str(config),
                us=seconds / copies * 1e6,
                bytes_per_s=rate(seconds),
                of_copy=rate(seconds) / copy_rate,
                vs_cublas=cublas / seconds,
            )
        ranked.sort(key=lambda item: item[0])
        best = ranked[0][1] if ranked else GemvConfig()
        # Correctness at the best shape: plain product against cuBLAS, fused against the unfused ops.
        w = weights[0]
        ref = F.linear(x, w).float()
        err = ((gemv(x, w, config=best).float() - ref).norm() / ref.norm()).item()
        row = dict(
            kind="best",
            shape=name,
            config=str(best),
            us=ranked[0][0] / copies * 1e6 if ranked else None,
            rel_err_vs_cublas=err,
        )
        if fused:
            silu = fused == "norm_silu"
            r_ref = residual.clone()
            hidden, _ = add_rms_norm(x, r_ref, norm, eps)
            ref = F.linear(hidden, w)
            ref = (silu_and_mul(ref) if silu else ref).float()
            out, new_res = rms_norm_gemv(x, residual, norm, eps, w, silu_mul=silu, config=best)
            row["fused_rel_err"] = ((out.float() - ref).norm() / ref.norm()).item()
            row["residual_equal"] = bool(torch.equal(new_res, r_ref))
            for candidate in CONFIGS if args.fused_sweep else [c for _, c in ranked[:3]]:
                if k % candidate.block_k:
                    continue
                seconds = time_graph(
                    lambda: [
                        rms_norm_gemv(x, residual, norm, eps, w, silu_mul=silu, config=candidate) for w in weights
                    ],
                    args.replays,
                )
                record(
                    kind="fused",
                    shape=name,
                    config=str(candidate),
                    us=seconds / copies * 1e6,
                    bytes_per_s=rate(seconds),
                    of_copy=rate(seconds) / copy_rate,
                    vs_cublas=cublas / seconds,
                )
        record(**row)
        weights = w = []  # drop this shape's copies before the next one's
        torch.cuda.empty_cache()
    layer_chain(record, copy_rate, args.replays)
    (args.out / "gemv_sweep.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
