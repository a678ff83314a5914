"""Cold-KV decode attention on the GPU: bf16 against int8 and int4 at long context.

llama3-8b shapes for one layer (8 KV heads of 128, 32 query heads), block size 16,
batch 8 x 32,768 tokens of context, hot window 128: every block older than the window
is cold. Times the Triton decode kernels (median of triton.testing.do_bench), checks
the cold kernel against the portable dequantize-then-attend path, and reports the
bytes each variant must read against the measured copy bandwidth.
Run on a CUDA machine: `python -m inferd.engine.bench.kv_quant_gpu --out DIR`.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from ..fast_path.availability import has_triton
from ..kv.block_pool import KIND_CODE
from ..kv.kv_cache import KVCache
from ..model.attention import AttentionMetadata, paged_attention


def build_case(
    kind: str,
    batch: int,
    context: int,
    hot_window: int,
    device: torch.device,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
):
    bs, kvh, hd, heads = 16, 8, 128, 32
    blocks_per_seq = -(-context // bs)
    cold_kinds = () if kind == "none" else (kind,)
    cache = KVCache(1, batch * blocks_per_seq + 8, 0, bs, kvh, hd, dtype, device, None, cold_kinds)
    gen = torch.Generator(device=device).manual_seed(seed)
    cache.device_pool.hot.normal_(generator=gen)
    k, v, cold = cache.layer_views(0)
    tables = torch.arange(batch * blocks_per_seq, device=device).view(batch, blocks_per_seq)
    kinds = torch.zeros_like(tables)
    slots = torch.zeros_like(tables)
    if kind != "none":
        per_page = cache.shape.slots_per_page()[kind]
        num_cold = (context - hot_window) // bs
        hot_pages = tables[:, :num_cold].reshape(-1).tolist()
        # cold slots packed into the pages after each sequence's hot ones: reuse the
        # sequence's own leading pages (their hot copy is quantized first, then replaced)
        pairs, new_pages, new_slots = [], [], []
        for i, page in enumerate(hot_pages):
            target_page, slot = hot_pages[i // per_page], i % per_page
            pairs.append((page, (kind, target_page, slot)))
            new_pages.append(target_page)
            new_slots.append(slot)
        # Block i goes to page i // per_page: every page is read (in this or an earlier chunk of
        # quantize) before a cold slot overwrites it.
        cache.quantize(pairs)
        tables[:, :num_cold] = torch.tensor(new_pages, device=device).view(batch, num_cold)
        slots[:, :num_cold] = torch.tensor(new_slots, device=device).view(batch, num_cold)
        kinds[:, :num_cold] = KIND_CODE[kind]
    q = torch.randn(batch, heads, hd, device=device, dtype=dtype, generator=gen)
    meta = AttentionMetadata(
        query_start=list(range(batch)),
        query_lens=[1] * batch,
        context_lens=torch.full((batch,), context, device=device),
        block_tables=tables,
        slot_mapping=torch.zeros(0, dtype=torch.long, device=device),
        positions=torch.full((batch,), context - 1, device=device),
        max_query_len=1,
        max_context_len=context,
        block_kinds=kinds if kind != "none" else None,
        block_slots=slots if kind != "none" else None,
    )
    return q, k, v, cold, meta, cache


if has_triton():
    import triton
    import triton.language as tl

    from ..fast_path.attention.cold_prefix import cold_entries

    @triton.jit
    def _stream_kernel(
        tables_ptr,
        slots_ptr,
        ck_ptr,
        cv_ptr,
        out_ptr,
        cold_tokens,
        stride_tb,
        stride_cp,
        stride_cs,
        stride_ct,
        stride_ch,
        BLOCK_SIZE: tl.constexpr,
        TILE: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        NUM_SPLITS: tl.constexpr,
    ):
        b, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        per_split = tl.cdiv(tl.cdiv(cold_tokens, NUM_SPLITS), TILE) * TILE
        lo = split * per_split
        hi = tl.minimum(lo + per_split, cold_tokens)
        d = tl.arange(0, HEAD_DIM)
        acc = tl.zeros([TILE, HEAD_DIM], tl.float32)
        for start in range(lo, hi, TILE):
            t = start + tl.arange(0, TILE)
            in_range = t < hi
            page, slot = cold_entries(tables_ptr, slots_ptr, b, t, hi, stride_tb, BLOCK_SIZE)
            base = page * stride_cp + slot * stride_cs + (t % BLOCK_SIZE) * stride_ct + kvh * stride_ch
            k = tl.load(ck_ptr + base[:, None] + d[None, :], mask=in_range[:, None], other=0)
            v = tl.load(cv_ptr + base[:, None] + d[None, :], mask=in_range[:, None], other=0)
            acc += k.to(tl.float32) + v.to(tl.float32)
        tl.store(out_ptr + (b * tl.num_programs(1) + kvh) * NUM_SPLITS + split, tl.sum(tl.sum(acc, 1), 0))


def stream_int8(cold, tables, slots, cold_tokens: int, splits: int, num_warps: int, num_stages: int, tile: int = 64):
    """Diagnostic: read every cold int8 K and V tile through the decode kernel's own
    addressing (`cold_entries`), convert to float and sum; no dot products, no softmax.
    It converts every code, as the kernel's bf16 variant does, so it is bound by those
    conversions as much as by the reads (offline SASS): its bandwidth is a ceiling for
    kernels that convert each code, not for the access pattern alone."""
    batch, kv_heads = tables.shape[0], cold.int8_k.shape[3]
    out = torch.empty(batch * kv_heads * splits, device=tables.device)
    data = cold.int8_k
    return lambda: _stream_kernel[(batch, kv_heads, splits)](
        tables,
        slots,
        cold.int8_k,
        cold.int8_v,
        out,
        cold_tokens,
        tables.stride(0),
        data.stride(0),
        data.stride(1),
        data.stride(2),
        data.stride(3),
        BLOCK_SIZE=16,
        TILE=tile,
        HEAD_DIM=data.shape[-1],
        NUM_SPLITS=splits,
        num_warps=num_warps,
        num_stages=num_stages,
    )


def bytes_read(kind: str, batch: int, context: int, hot_window: int, cache) -> int:
    shape = cache.shape
    per_token_hot = 2 * shape.num_kv_heads * shape.head_dim * 2  # K and V, bf16
    cold_tokens = 0 if kind == "none" else (context - hot_window) // 16 * 16
    hot_tokens = context - cold_tokens
    cold_block = 0 if kind == "none" else shape.cold_block_bytes(kind)
    return batch * (hot_tokens * per_token_hot + cold_tokens // 16 * cold_block)


def _copy_bandwidth(device: torch.device) -> float:
    """Device-to-device copy rate (read + write) over 1 GiB; the buffers go with the call."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() / (copy_ms / 1e3)


def main() -> int:
    # Triton and its kernels: this module imports without them (has_triton above)
    import triton.testing

    from ..fast_path.attention import (
        choose_num_splits,
        cold_paged_decode_attention,
        cold_prefix_decode_attention,
        paged_decode_attention,
    )

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--hot-window", type=int, default=128)
    args = parser.parse_args()
    device = torch.device("cuda")
    copy_bw = _copy_bandwidth(device)
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_bandwidth_bytes_per_s": copy_bw,
        "batch": args.batch,
        "context": args.context,
        "hot_window": args.hot_window,
        "kinds": {},
    }
    for kind in ("none", "int8", "int4"):
        q, k, v, cold, meta, cache = build_case(kind, args.batch, args.context, args.hot_window, device)
        splits = choose_num_splits(args.batch, 8, args.context)
        ref = paged_attention(q, k, v, meta, 128**-0.5, cold=cold if kind != "none" else None)
        if kind == "none":
            fn = lambda: paged_decode_attention(q, k, v, meta.block_tables, meta.context_lens, 128**-0.5, splits)
        else:
            code = KIND_CODE[kind]
            tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
            cold_blocks = (meta.block_kinds != 0).sum(1).int()
            fn = lambda: cold_prefix_decode_attention(
                q,
                k,
                v,
                cold,
                tables,
                slots,
                cold_blocks,
                code,
                meta.context_lens,
                128**-0.5,
                splits,
            )
            general = lambda: cold_paged_decode_attention(
                q,
                k,
                v,
                cold,
                meta.block_tables,
                meta.block_kinds,
                meta.block_slots,
                meta.context_lens,
                128**-0.5,
                splits,
            )
        out = fn()
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        nbytes = bytes_read(kind, args.batch, args.context, args.hot_window, cache)
        results["kinds"][kind] = {
            "ms": ms,
            "bytes": nbytes,
            "bandwidth_share": nbytes / (ms / 1e3) / copy_bw,
            "rel_err_vs_portable": err,
        }
        if kind != "none":  # the general per-tile kernel (any layout of kinds), for comparison
            results["kinds"][kind]["general_kernel_ms"] = triton.testing.do_bench(
                general, warmup=10, rep=100, return_mode="median"
            )
            sweep = {}
            for warps in (2, 4):
                for stages in (1, 2, 3):
                    for tile in (64, 128):
                        run = lambda: cold_prefix_decode_attention(
                            q,
                            k,
                            v,
                            cold,
                            tables,
                            slots,
                            cold_blocks,
                            code,
                            meta.context_lens,
                            128**-0.5,
                            splits,
                            num_warps=warps,
                            num_stages=stages,
                            tile=tile,
                        )
                        try:
                            sweep[f"w{warps}s{stages}t{tile}"] = triton.testing.do_bench(
                                run, warmup=5, rep=40, return_mode="median"
                            )
                        except Exception as exc:  # e.g. out of shared memory for a large tile and many stages
                            sweep[f"w{warps}s{stages}t{tile}"] = f"{type(exc).__name__}"
            for splits_try in (splits // 2, splits * 2, splits * 4):
                run = lambda: cold_prefix_decode_attention(
                    q,
                    k,
                    v,
                    cold,
                    tables,
                    slots,
                    cold_blocks,
                    code,
                    meta.context_lens,
                    128**-0.5,
                    splits_try,
                )
                sweep[f"splits{splits_try}"] = triton.testing.do_bench(run, warmup=5, rep=40, return_mode="median")
            results[f"{kind}_prefix_kernel_sweep_ms"] = sweep
            if kind == "int8":
                cold_tokens = (args.context - args.hot_window) // 16 * 16
                stream_bytes = args.batch * cold_tokens // 16 * cache.shape.cold_block_bytes("int8")
                diag = {}
                for warps, stages, tile, n_splits in (
                    (2, 2, 64, splits),
                    (8, 3, 64, splits),
                    (4, 2, 128, splits),
                    (8, 3, 128, splits),
                    (8, 3, 256, splits),
                    (4, 2, 64, 4 * splits),
                    (8, 3, 128, 4 * splits),
                ):
                    t_ms = triton.testing.do_bench(
                        stream_int8(cold, tables, slots, cold_tokens, n_splits, warps, stages, tile),
                        warmup=5,
                        rep=40,
                        return_mode="median",
                    )
                    diag[f"w{warps}s{stages}t{tile}splits{n_splits}"] = {
                        "ms": t_ms,
                        "bandwidth_share": stream_bytes / (t_ms / 1e3) / copy_bw,
                    }
                results["int8_stream_only_diagnostic"] = diag
                print(
                    "int8 stream-only (no dots):",
                    {k_: round(v_["bandwidth_share"], 2) for k_, v_ in diag.items()},
                    flush=True,
                )
            timed = {k_: v_ for k_, v_ in sweep.items() if isinstance(v_, float)}
            best = min(timed, key=timed.__getitem__)
            print(f"{kind} sweep best {best} {timed[best] * 1e3:.1f} us; default {ms * 1e3:.1f} us", flush=True)
        q = k = v = cold = meta = cache = None  # frees this size's buffers before the next
        torch.cuda.empty_cache()
    # launch-parameter sweep for the general cold kernel (int8)
    q, k, v, cold, meta, cache = build_case("int8", args.batch, args.context, args.hot_window, device)
    splits = choose_num_splits(args.batch, 8, args.context)
    sweep = {}
    for warps in (2, 4):
        for stages in (1, 2):
            fn = lambda: cold_paged_decode_attention(
                q,
                k,
                v,
                cold,
                meta.block_tables,
                meta.block_kinds,
                meta.block_slots,
                meta.context_lens,
                128**-0.5,
                splits,
                num_warps=warps,
                num_stages=stages,
            )
            sweep[f"w{warps}s{stages}"] = triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
    for splits_try in (splits // 2, splits * 2):
        fn = lambda: cold_paged_decode_attention(
            q,
            k,
            v,
            cold,
            meta.block_tables,
            meta.block_kinds,
            meta.block_slots,
            meta.context_lens,
            128**-0.5,
            splits_try,
        )
        sweep[f"splits{splits_try}"] = triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
    results["int8_launch_sweep_ms"] = sweep
    print("int8 sweep (ms):", {k_: round(v_, 4) for k_, v_ in sweep.items()}, "default splits", splits)
    q = k = v = cold = meta = cache = None  # frees the buffers before the next case
    base = results["kinds"]["none"]["ms"]
    for kind, r in results["kinds"].items():
        r["speedup_vs_bf16"] = base / r["ms"]
        print(
            f"{kind:5s} {r['ms'] * 1e3:8.1f} us/layer  {r['speedup_vs_bf16']:.2f}x  "
            f"{r['bandwidth_share']:.2f} of copy bw  err vs portable {r['rel_err_vs_portable']:.1e}"
        )
    os.makedirs(args.out, exist_ok=True)
    with open(f"{args.out}/kv_quant_gpu.json", "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
