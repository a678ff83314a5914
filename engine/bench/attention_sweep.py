"""Attention launch-shape sweep on the GPU: the paged decode kernel (attention/hot.py) at
8-256 rows and the chunk-row kernel (attention/chunk_rows.py) at 32-128 rows of one
sequence after a 2,080-token prefix, over split counts, warps and load stages, on the
llama3-8b-shape heads (32 query, 8 KV, dim 128, block 16).

Each timing replays a CUDA graph of 20 launches (gemv_sweep.time_graph), so host launch
cost is not in it. Throughput is the K/V bytes the rows must read over the time (for the
chunk rows, the one sequence's K/V, which every pack reads). Every variant is checked
against the current launch shape's output. Prints one JSON line per measurement and
writes them to --out.

    python -m inferd.engine.bench.attention_sweep --out results/ [--kinds chunk --pack-rows 4,16 --warps 4 --stages 2]
        [--splits 1,2,4 --tiles 32,64 --merge-tiles 8192,32768 --prefetch 0,1]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ..fast_path.attention import (
    choose_num_splits,
    chunk_num_splits,
    chunk_rows,
    paged_chunk_attention,
    paged_decode_attention,
    rows_per_pack,
)
from ..fast_path.attention.chunk_rows import CHUNK_PREFETCH, CHUNK_STAGES, large_pack_queries
from ..fast_path.attention.common import MERGE_TILE_ELEMENTS, TILE_TOKENS
from ..fast_path.cuda_graphs import LARGE_PACK_MIN_ROWS
from .gemv_sweep import json_recorder, time_graph

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
MAX_MODEL_LEN = 40960  # the engine's graphs choose splits for this longest context
LAUNCHES = 20


def kv_cache(num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    return k, torch.randn_like(k)


def decode_inputs(rows: int, context: int):
    """`rows` sequences at `context`, each over its own random blocks."""
    per = -(-context // BLOCK)
    k, v = kv_cache(rows * per)
    tables = torch.randperm(rows * per, device="cuda").view(rows, per).int()
    lens = torch.full((rows,), context, device="cuda", dtype=torch.int32)
    q = torch.randn(rows, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    return q, k, v, tables, lens


def chunk_inputs(rows: int, context: int):
    """`rows` new tokens of one sequence ending at `context`, sharing its block table."""
    per = -(-context // BLOCK)
    k, v = kv_cache(per)
    tables = torch.randperm(per, device="cuda").int().unsqueeze(0).expand(rows, per).contiguous()
    lens = torch.arange(context - rows + 1, context + 1, device="cuda", dtype=torch.int32)
    q = torch.randn(rows, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    return q, k, v, tables, lens


WARPS, STAGES = (2, 4, 8), (2, 3, 4)


def sweep(
    record,
    kind: str,
    rows: int,
    context: int,
    run,
    split_counts,
    current,
    nbytes: int,
    warp_counts=WARPS,
    stage_counts=STAGES,
    engine_kernel: bool = True,
    **fields,
) -> None:
    """Time `run(splits, warps, stages)` over the grid; `current`: the engine's (splits, warps, stages)
    (its output is the reference; the engine's launch when `engine_kernel`, the other
    compile-time fields being the engine's); `fields` go into every record."""
    reference = run(*current).float()
    for splits in split_counts:
        for warps in warp_counts:
            for stages in stage_counts:
                out = run(splits, warps, stages).float()
                err = ((out - reference).norm() / reference.norm()).item()
                seconds = time_graph(lambda: [run(splits, warps, stages) for _ in range(LAUNCHES)], 7) / LAUNCHES
                record(
                    kind=kind,
                    rows=rows,
                    context=context,
                    **fields,
                    splits=splits,
                    num_warps=warps,
                    num_stages=stages,
                    current=engine_kernel and (splits, warps, stages) == current,
                    us=seconds * 1e6,
                    tb_s=nbytes / seconds / 1e12,
                    rel_err=err,
                )


def compiled_variants(kernel) -> list[dict]:
    """Registers a thread and spilled bytes of each compiled variant of a Triton kernel,
    with its compile-time arguments. Best effort: the cache's layout is Triton's own, so a
    version that moves it gives one row naming the error instead."""
    rows: list[dict] = []
    try:
        for caches in kernel.device_caches.values():
            for compiled in caches[0].values():
                compiled._init_handles()
                constants = {}
                for key, value in compiled.src.constants.items():
                    index = key[0] if isinstance(key, tuple) else key
                    name = kernel.arg_names[index] if isinstance(index, int) else str(key)
                    if isinstance(value, (int, bool)) and name.isupper():
                        constants[name] = value
                rows.append(
                    dict(
                        kind="compiled",
                        kernel=kernel.__name__,
                        n_regs=compiled.n_regs,
                        n_spills=compiled.n_spills,
                        num_warps=compiled.metadata.num_warps,
                        num_stages=compiled.metadata.num_stages,
                        **constants,
                    )
                )
    except Exception as error:  # a readout of Triton internals must not lose the sweep
        rows.append(dict(kind="compiled", kernel=getattr(kernel, "__name__", "?"), error=repr(error)))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop sweeping after this long")
    parser.add_argument(
        "--pack-rows",
        default="",
        help="comma-separated rows per pack for the chunk rows (default: the engine's, rows_per_pack)",
    )
    parser.add_argument("--kinds", default="chunk,decode", help="which kernels to sweep: chunk, decode")
    parser.add_argument("--warps", default=",".join(map(str, WARPS)), help="comma-separated warp counts")
    parser.add_argument("--stages", default=",".join(map(str, STAGES)), help="comma-separated load stages")
    parser.add_argument(
        "--splits", default="", help="comma-separated split counts for the chunk rows (default: around the engine's)"
    )
    parser.add_argument(
        "--tiles", default=str(TILE_TOKENS), help="comma-separated keys per iteration for the chunk rows"
    )
    parser.add_argument(
        "--merge-tiles",
        default=str(MERGE_TILE_ELEMENTS),
        help="comma-separated float32 elements a merge round of the chunk rows holds (32768: 16 splits of a pack)",
    )
    parser.add_argument(
        "--prefetch",
        default=str(int(CHUNK_PREFETCH)),
        help="comma-separated 0/1: the kernels load block-table entries a tile ahead",
    )
    args = parser.parse_args(argv)
    warp_counts = tuple(map(int, args.warps.split(",")))
    stage_counts = tuple(map(int, args.stages.split(",")))
    kinds = set(args.kinds.split(","))
    if not torch.cuda.is_available():
        raise SystemExit("attention_sweep needs a CUDA GPU (torch.cuda.is_available() is False)")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: list[dict] = []
    record = json_recorder(results)

    torch.manual_seed(0)
    scale = HEAD_DIM**-0.5
    kv_bytes_per_token = KV_HEADS * HEAD_DIM * 2 * 2
    packs = [int(p) for p in args.pack_rows.split(",")] if args.pack_rows else []
    tiles = [int(t) for t in args.tiles.split(",")]
    merge_tiles = [int(m) for m in args.merge_tiles.split(",")]
    prefetches = [bool(int(p)) for p in args.prefetch.split(",")]
    for rows in (32, 64, 128) if "chunk" in kinds else ():
        q, k, v, tables, lens = chunk_inputs(rows, 2080)
        queries = large_pack_queries(HEAD_DIM) if rows >= LARGE_PACK_MIN_ROWS else 16
        engine_pack = rows_per_pack(HEADS, KV_HEADS, queries)  # as cuda_graphs.DecodeGraphs.pack_for
        variants = [
            (p, t, m, f) for p in packs or [engine_pack] for t in tiles for m in merge_tiles for f in prefetches
        ]
        for pack, tile, merge, prefetch in variants:
            if time.perf_counter() - started > args.budget_s:
                break
            splits = chunk_num_splits(rows // pack, KV_HEADS, MAX_MODEL_LEN)
            current = (splits, 4, CHUNK_STAGES)

            def chunk(splits, warps, stages, inputs=(q, k, v, tables, lens), shape=(pack, tile, merge, prefetch)):
                pack, tile, merge, prefetch = shape
                return paged_chunk_attention(*inputs, scale, splits, pack, warps, stages, tile, merge, prefetch)

            if args.splits:
                options = [int(s) for s in args.splits.split(",")]
            else:
                options = sorted({s for s in (splits // 2, splits, splits * 2) if 1 <= s <= 64})
            sweep(
                record,
                "chunk",
                rows,
                2080,
                chunk,
                options,
                current,
                2080 * kv_bytes_per_token,
                warp_counts=warp_counts,
                stage_counts=stage_counts,
                engine_kernel=(pack, tile, merge, prefetch)
                == (engine_pack, TILE_TOKENS, MERGE_TILE_ELEMENTS, CHUNK_PREFETCH),
                rows_per_pack=pack,
                tile_tokens=tile,
                merge_tile=merge,
                prefetch=prefetch,
            )
    for rows in (8, 32, 64, 128, 256) if "decode" in kinds else ():
        for context in (640, 4096):
            if time.perf_counter() - started > args.budget_s:
                break
            q, k, v, tables, lens = decode_inputs(rows, context)
            splits = choose_num_splits(rows, KV_HEADS, MAX_MODEL_LEN)
            options = sorted({s for s in (splits // 2, splits, splits * 2) if 1 <= s <= 64})

            for prefetch in prefetches:

                def decode(splits, warps, stages, inputs=(q, k, v, tables, lens), prefetch=prefetch):
                    return paged_decode_attention(*inputs, scale, splits, None, False, warps, stages, prefetch)

                sweep(
                    record,
                    "decode",
                    rows,
                    context,
                    decode,
                    options,
                    (splits, 4, 3),
                    rows * context * kv_bytes_per_token,
                    warp_counts=warp_counts,
                    stage_counts=stage_counts,
                    engine_kernel=not prefetch,
                    prefetch=prefetch,
                )
    if "chunk" in kinds:
        for row in compiled_variants(chunk_rows._chunk_split_kernel):
            record(**row)
    (args.out / "attention_sweep.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
