"""Session 7: the cold prefix kernel (compiled, PTX conversions) against the portable cold attention
on shapes other than the benchmark's: block sizes, head dims, GQA groups, fp16/bf16, splits, tables
ahead 0/2/3 (which must agree bitwise), cold_dots 1 and 2. Prints one line per case."""
import json, os, sys, time
import torch
from engine.attention import AttentionMetadata, paged_attention, write_kv
from engine.fast_path.triton_cold_prefix_attention import cold_prefix_decode_attention
from engine.kv_cache import KIND_CODE, KVCache

dev = torch.device(os.environ.get("DEV", "cuda"))


def case(kind, bs, kvh, hd, heads, dtype, ctx, window, seed):
    gen = torch.Generator(device=dev).manual_seed(seed)
    pages = sum(-(-n // bs) for n in ctx) * 2 + 8
    cache = KVCache(1, pages, 0, bs, kvh, hd, dtype, dev, None, (kind,))
    cache.device_pool.bytes.zero_() if os.environ.get("ZERO") else None
    k, v, cold = cache.layer_views(0)
    per_page = cache.shape.slots_per_page()[kind]
    first_cold = pages // 2
    tables, kinds, slots, hot_tables, pairs, used, nxt = [], [], [], [], [], 0, 0
    for n in ctx:
        row, krow, srow, hrow = [], [], [], []
        for j in range(-(-n // bs)):
            hrow.append(nxt); row.append(nxt); krow.append(0); srow.append(0)
            if (j + 1) * bs <= n - window:
                page, slot = first_cold + used // per_page, used % per_page
                used += 1
                pairs.append((nxt, (kind, page, slot)))
                row[-1], krow[-1], srow[-1] = page, KIND_CODE[kind], slot
            nxt += 1
        tables.append(row); kinds.append(krow); slots.append(srow); hot_tables.append(hrow)
    token_slots = torch.tensor([hot_tables[i][t // bs] * bs + t % bs for i, n in enumerate(ctx) for t in range(n)],
                               device=dev)
    write_kv(k, v, torch.randn(len(token_slots), kvh, hd, generator=gen, device=dev).to(dtype),
             torch.randn(len(token_slots), kvh, hd, generator=gen, device=dev).to(dtype), token_slots)
    cache.quantize(pairs)
    width = max(map(len, tables))
    tb, kd, sl = [torch.tensor([r + [0] * (width - len(r)) for r in rows], device=dev) for rows in (tables, kinds, slots)]
    # shuffle the cold (page, slot) pairs within the table so a wrong tile's entry or scale shows
    meta = AttentionMetadata(query_start=list(range(len(ctx))), query_lens=[1] * len(ctx),
                             context_lens=torch.tensor(ctx, device=dev), block_tables=tb,
                             slot_mapping=torch.zeros(0, dtype=torch.long, device=dev),
                             positions=torch.tensor([max(n - 1, 0) for n in ctx], device=dev), max_query_len=1,
                             max_context_len=max(ctx), block_kinds=kd, block_slots=sl)
    q = torch.randn(len(ctx), heads, hd, generator=gen, device=dev).to(dtype)
    return q, k, v, cold, meta


t0 = time.time()
ctx = [1, 9, 17, 40, 70, 150, 700, 3001, 0] if dev.type == "cuda" else [1, 17, 70, 150, 0]
shapes = [(16, 8, 128, 32, torch.bfloat16, 128), (32, 4, 128, 32, torch.float16, 64), (16, 2, 64, 16, torch.bfloat16, 16),
          (8, 2, 64, 2, torch.float16, 8)]
results, worst = [], 0.0
for kind in ("int8", "int4"):
    for bs, kvh, hd, heads, dtype, window in shapes:
        q, k, v, cold, meta = case(kind, bs, kvh, hd, heads, dtype, ctx, window, seed=bs + hd)
        ref = paged_attention(q.float(), k, v, meta, hd ** -0.5, cold=cold).float()
        tables, slots = meta.block_tables.int().contiguous(), meta.block_slots.int().contiguous()
        cold_blocks = (meta.block_kinds != 0).sum(1).int()
        for splits in ((1, 4) if bs == 16 and hd == 128 else (4,)):
            for dots in ((2, 1) if kind == "int8" and bs == 16 and hd == 128 else (2,)):
                outs = {}
                for ahead in (0, 2, 3):
                    out = cold_prefix_decode_attention(q, k, v, cold, tables, slots, cold_blocks, KIND_CODE[kind],
                                                       meta.context_lens, hd ** -0.5, splits, cold_dots=dots,
                                                       tables_ahead=ahead)
                    outs[ahead] = out.float()
                err = ((outs[2] - ref).norm() / ref.norm()).item()
                same = all(torch.equal(outs[a], outs[0]) for a in (2, 3))
                padded_zero = bool(outs[2][-1].abs().max() == 0)
                finite = bool(torch.isfinite(outs[2]).all())
                row = dict(kind=kind, bs=bs, kvh=kvh, hd=hd, heads=heads, dtype=str(dtype), splits=splits, dots=dots,
                           rel_err=err, ahead_equal=same, padded_zero=padded_zero, finite=finite)
                ok = same and padded_zero and finite and err < 2e-2
                worst = max(worst, err)
                results.append(dict(row, ok=ok))
                print(("PASS" if ok else "FAIL"), json.dumps(row), f"[{time.time() - t0:.0f}s]", flush=True)
json.dump(results, open(sys.argv[1], "w"), indent=1)
print("cases", len(results), "failed", sum(not r["ok"] for r in results), "worst rel err", worst)
