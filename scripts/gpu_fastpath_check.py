"""On-GPU correctness checks of the fast path, plus a quick timing.

Run from the repository root on a CUDA machine:
    PYTHONPATH=. python3 scripts/gpu_fastpath_check.py --out DIR [--dtype float16]
        [--model-sections check_greedy,check_batch_invariance]
(`--dry-run` runs the model sections on the CPU with the tiny preset: Python code only.)
1. the Triton decode kernel against a float64 reference at contexts 1, 15, 16, 17, 4095,
   4097, 32768 (crossing block and split boundaries), with a padded row and a sliding
   window, for several split counts; the decode and chunk-row kernels at other head counts
   and dims (no GQA, GQA 3-7, head dims 64-128) and row counts that are not whole packs;
2. the fused ops against their torch references, in bf16;
3. on the `llama3-8b-shape` preset in bf16, one set of random weights shared by the fast
   engine, the portable (fallback) engine and transformers: greedy agreement on 32
   tokens, relative logit error, batch invariance, graphs against eager, the contexts of
   (1) end to end, the switch to fallback on an injected failure, and a lone 6-token chunk
   then eight mixed-length prompts after a cached prefix, strict (a launch bug raises) and
   never leaving the fast path; `--shape` runs these on another model (multi-head small and
   8B-class, GQA 3/6/7, head dims 64/80/96, q/k/v bias, tied embeddings: SHAPES);
4. quick timing: fused ops (Triton against torch.compile and eager), batch-1 decode.
Writes DIR/check_<dtype>.json; exits 1 when a check fails. In bf16 the greedy check
compares the fast path's logit error with the portable path's (both about 2.4 % from
transformers on a random 8B-shape checkpoint, which flips greedy tokens in either); in
fp16 it also demands 32/32 greedy agreement wherever the portable path has it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from unittest import mock

import torch

CONTEXTS = (1, 15, 16, 17, 4095, 4097, 32768)
BF16_REL_TOL = 2e-2  # relative L2 error of one bf16 kernel's output (METHOD.md: bf16 lands 1e-3..1e-2)
# End to end, 32 bf16 layers put the portable path itself about 2.4 % (relative L2 of the
# logits) from transformers on the same weights (first device run): the fast path passes
# when its error is within NOISE_RATIO of that, and where a token flips the comparison
# stops at the flip (after it the contexts differ).
NOISE_RATIO = 1.25
MODEL_REL_TOL = 5e-2
DTYPE_NAME = "bfloat16"
results: dict = {"checks": {}, "timing": {}}
failures: list[str] = []
T0 = time.perf_counter()
DEVICE = "cuda"  # --dry-run: cpu, tiny preset, float32, kernels in Triton's interpreter
PRESET = "llama3-8b-shape"
# The model the model sections run on (`--shape`): the 8B shape, or a smaller one with the
# traits of a family users load; random weights either way.
SHAPES: dict[str, dict] = {
    "llama3-8b-shape": dict(preset="llama3-8b-shape"),
    # Llama-3.2-1B: head_dim 64, tied embeddings
    "head-dim-64": dict(
        preset="small",
        tie_word_embeddings=True,
        overrides=dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=4,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=40960,
        ),
    ),
    # Qwen2.5-0.5B: GQA 7 (14 heads over 2), head_dim 64, q/k/v bias, tied embeddings
    "gqa-7-bias": dict(
        preset="small",
        arch="qwen2",
        tie_word_embeddings=True,
        overrides=dict(
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=4,
            num_attention_heads=14,
            num_key_value_heads=2,
            max_position_embeddings=40960,
        ),
    ),
    # Qwen2.5-1.5B: GQA 6 (12 heads over 2), head_dim 128, q/k/v bias
    "gqa-6-bias": dict(
        preset="small",
        arch="qwen2",
        overrides=dict(
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=4,
            num_attention_heads=12,
            num_key_value_heads=2,
            max_position_embeddings=40960,
        ),
    ),
    # Llama-2-7B: multi-head attention at the 8B class (32 heads, 32 KV heads, head_dim 128)
    "mha-8b": dict(
        preset="llama3-8b-shape",
        overrides=dict(intermediate_size=11008, num_key_value_heads=32),
    ),
    # Phi-2's attention: head_dim 80 (not a power of two), no GQA
    "head-dim-80": dict(
        preset="small",
        overrides=dict(
            hidden_size=2560,
            intermediate_size=6912,
            num_hidden_layers=4,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=40960,
        ),
    ),
    # Phi-3-mini's attention: head_dim 96 (not a power of two), here with GQA 3
    "head-dim-96-gqa-3": dict(
        preset="small",
        overrides=dict(
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=4,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=40960,
        ),
    ),
    # multi-head attention without grouping (8 query heads, 8 KV heads)
    "mha": dict(
        preset="small",
        overrides=dict(
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=8,
            max_position_embeddings=40960,
        ),
    ),
}
SHAPE = "llama3-8b-shape"


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def check(name: str, ok: bool, **detail) -> None:
    results["checks"][name] = {"ok": bool(ok), **detail}
    if not ok:
        failures.append(name)
    log(f"{'PASS' if ok else 'FAIL'} {name} {json.dumps(detail, default=str)[:300]}")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# --- 1. kernel -----------------------------------------------------------------------------
def check_attention_kernel() -> None:
    from inferd.engine.fast_path.attention import paged_decode_attention

    gen = torch.Generator(device="cuda").manual_seed(0)
    heads, kv_heads, dim, bs, layers = 32, 8, 128, 16, 2
    ctx = torch.tensor(list(CONTEXTS) + [0], device="cuda", dtype=torch.int32)  # 0: padded row
    need = [-(-int(c) // bs) for c in ctx]
    num_pages = sum(need) + 64
    arena = torch.randn(num_pages, 2, layers, bs, kv_heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k_cache, v_cache = arena[:, 0, 1], arena[:, 1, 1]
    perm = torch.randperm(num_pages, device="cuda", generator=gen)
    tables = torch.zeros(len(ctx), max(need), dtype=torch.int32, device="cuda")
    start = 0
    for i, n in enumerate(need):
        tables[i, :n] = perm[start : start + n]
        start += n
    for window in (None, 4096):
        q = torch.randn(len(ctx), heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        ref = torch.zeros(len(ctx), heads, dim, dtype=torch.float64, device="cuda")
        for b, n in enumerate(ctx.tolist()):
            if n == 0:
                continue
            pages = tables[b, : need[b]].long()
            k = k_cache[pages].reshape(-1, kv_heads, dim)[:n].double().repeat_interleave(heads // kv_heads, 1)
            v = v_cache[pages].reshape(-1, kv_heads, dim)[:n].double().repeat_interleave(heads // kv_heads, 1)
            first = max(0, n - window) if window else 0
            s = torch.einsum("hd,thd->ht", q[b].double(), k[first:]) * dim**-0.5
            ref[b] = torch.einsum("ht,thd->hd", s.softmax(-1), v[first:])
        for splits in (1, 4, 16, 64):
            out = paged_decode_attention(q, k_cache, v_cache, tables, ctx, dim**-0.5, splits, window)
            torch.cuda.synchronize()
            per_ctx = {int(c): rel(out[i], ref[i]) for i, c in enumerate(ctx.tolist()) if c}
            ok = (
                torch.isfinite(out).all().item()
                and max(per_ctx.values()) < BF16_REL_TOL
                and out[-1].abs().max().item() == 0
            )
            check(f"attention_kernel_splits{splits}_window{window}", ok, rel_err=per_ctx)


def check_attention_shapes() -> None:
    """The decode and chunk-row kernels at the shapes users load (no GQA, GQA 3/5/6/7, head
    dims 64/80/96/128) and row counts that are not whole packs, against float64."""
    from inferd.engine.fast_path.attention import (
        large_pack_queries,
        paged_chunk_attention,
        paged_decode_attention,
        rows_per_pack,
    )

    gen = torch.Generator(device="cuda").manual_seed(2)
    bs, pages = 16, 96
    for heads, kv_heads, dim in ((16, 16, 128), (32, 32, 80), (24, 8, 96), (14, 2, 64), (12, 2, 128), (20, 4, 128)):
        arena = torch.randn(pages, 2, 2, bs, kv_heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        k_cache, v_cache = arena[:, 0, 1], arena[:, 1, 1]
        table = torch.randperm(pages, device="cuda", generator=gen)[:64].to(torch.int32)
        scale = dim**-0.5

        def reference(q, ctx):
            out = torch.zeros(q.shape, dtype=torch.float64, device="cuda")
            k = k_cache[table.long()].reshape(-1, kv_heads, dim).double().repeat_interleave(heads // kv_heads, 1)
            v = v_cache[table.long()].reshape(-1, kv_heads, dim).double().repeat_interleave(heads // kv_heads, 1)
            for b, n in enumerate(ctx.tolist()):
                if n:
                    s = torch.einsum("hd,thd->ht", q[b].double(), k[:n]) * scale
                    out[b] = torch.einsum("ht,thd->hd", s.softmax(-1), v[:n])
            return out

        worst = {}
        for rows in (1, 7, 8, 13):  # decode rows at odd batch sizes; from 7 on, the last one padding
            ctx = torch.tensor([1000 - 37 * i if i < 6 else 0 for i in range(rows)], device="cuda")
            q = torch.randn(rows, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            out = paged_decode_attention(q, k_cache, v_cache, table.expand(rows, -1).contiguous(), ctx, scale, 8)
            worst[f"decode{rows}"] = rel(out, reference(q, ctx))
        for queries in (16, large_pack_queries(dim)):
            pack = rows_per_pack(heads, kv_heads, queries)
            for new in (6, 2 * pack + 3):  # a chunk shorter than a pack, and one ending in a partial pack
                size = 1 << (new - 1).bit_length()  # the graph holding the chunk's rows
                ctx = torch.tensor([500 + i + 1 for i in range(new)] + [0] * (size - new), device="cuda")
                q = torch.randn(size, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                tables = table.expand(size, -1).contiguous()
                out = paged_chunk_attention(q, k_cache, v_cache, tables, ctx, scale, 4, pack)
                worst[f"chunk{new}_pack{pack}"] = rel(out[:new], reference(q, ctx)[:new])
        torch.cuda.synchronize()
        check(f"attention_shape_h{heads}_kv{kv_heads}_d{dim}", max(worst.values()) < BF16_REL_TOL, rel_err=worst)


def check_fused_ops() -> None:
    from inferd.engine.fast_path import fused_ops as ops

    gen = torch.Generator(device="cuda").manual_seed(1)
    dt = torch.bfloat16
    x = torch.randn(64, 4096, device="cuda", dtype=dt, generator=gen)
    res = torch.randn(64, 4096, device="cuda", dtype=dt, generator=gen)
    w = (1 + 0.1 * torch.randn(4096, device="cuda", generator=gen)).to(dt)
    r1, r2 = res.clone(), res.clone()
    o1, _ = ops.add_rms_norm(x, r1, w, 1e-5)
    o2, _ = ops.add_rms_norm_reference(x, r2, w, 1e-5)
    check(
        "fused_add_rms_norm",
        rel(o1, o2) < 1e-2 and torch.equal(r1, r2),
        rel_err=rel(o1, o2),
        max_abs=float((o1.float() - o2.float()).abs().max()),
    )
    gu = torch.randn(64, 2 * 14336, device="cuda", dtype=dt, generator=gen)
    a, b = ops.silu_and_mul(gu), ops.silu_and_mul_reference(gu)
    check("fused_silu_and_mul", rel(a, b) < 1e-2, rel_err=rel(a, b))
    tokens, heads, kvh, dim = 64, 32, 8, 128
    qkv = torch.randn(tokens, (heads + 2 * kvh) * dim, device="cuda", dtype=dt, generator=gen)
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kvh) * dim].view(tokens, kvh, dim)
    v = qkv[:, (heads + kvh) * dim :].view(tokens, kvh, dim)
    pos = torch.randint(0, 32768, (tokens,), device="cuda", generator=gen)
    from inferd.engine.model.make_model import PRESETS
    from inferd.engine.model.model import rope_inv_freq
    from inferd.engine.model.model_config import ModelConfig

    cfg = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "head_dim": dim, **PRESETS["llama3-8b-shape"]})
    inv = rope_inv_freq(cfg).cuda()
    slots = torch.randperm(64 * 16, device="cuda", generator=gen)[:tokens]
    slots[::7] = -1
    arena1 = torch.randn(64, 2, 2, 16, kvh, dim, device="cuda", dtype=dt, generator=gen)
    arena2 = arena1.clone()
    q1, q2 = q.clone(), q.clone()
    ops.rope_and_cache(q1, k, v, pos, inv, arena1[:, 0, 1], arena1[:, 1, 1], slots)
    ops.rope_and_cache_reference(q2, k, v, pos, inv, arena2[:, 0, 1], arena2[:, 1, 1], slots)
    check(
        "fused_rope_and_cache",
        rel(q1, q2) < 1e-2 and rel(arena1, arena2) < 1e-2,
        q_rel_err=rel(q1, q2),
        cache_rel_err=rel(arena1, arena2),
        q_mismatch_share=float((q1 != q2).float().mean()),
    )


# --- 3. model ------------------------------------------------------------------------------
def record_logits(engine) -> dict[str, list[torch.Tensor]]:
    """request id -> logits of each of its sampling steps (float32, on the CPU)."""
    seen: dict[str, list[torch.Tensor]] = {}
    execute = engine.runner.execute

    def recording(batch):
        output = execute(batch)
        rows = [it.seq.request_id for it in batch if it.completes]
        for rid, row in zip(rows, output.logits):
            seen.setdefault(rid, []).append(row.float().cpu())
        return output

    engine.runner.execute = recording
    return seen


def generate(engine, batch_prompts, max_tokens, tag):
    from inferd.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(len(batch_prompts))]
    for rid, p in zip(ids, batch_prompts):
        engine.add_request(rid, p, params)
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return [done[r] for r in ids], ids


def agree(a: list[int], b: list[int]) -> int:
    """Length of the common prefix."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def check_model() -> None:
    from inferd.engine.bench.gpu_harness import build, new_engine
    from inferd.engine.bench.random_model import hf_model_sharing_weights

    spec = dict(SHAPES[SHAPE]) if DEVICE == "cuda" else dict(preset=PRESET)
    model_dir, model = build(device=DEVICE, dtype=DTYPE_NAME if DEVICE == "cuda" else None, **spec)
    vocab = model.config.vocab_size
    log(f"{SHAPE if DEVICE == 'cuda' else PRESET} model built on {DEVICE}")
    # Synchronous steps: record_logits sees every step's logits (async steps keep them on the device).
    common = dict(
        kv_gib=20 if DEVICE == "cuda" else 0.02,
        max_num_batched_tokens=2048,
        enable_prefix_caching=False,
        async_scheduling=False,
    )
    fast = new_engine(model_dir, model, "fast", **common)
    slow = new_engine(model_dir, model, "fallback", **common)
    check(
        "fast_path_attached",
        fast.fast_path_unavailable is None and fast.runner.fast_decode is not None,
        reason=fast.fast_path_unavailable,
    )
    fast_logits, slow_logits = record_logits(fast), record_logits(slow)
    hf = hf_model_sharing_weights(model_dir, model)

    ctx = dict(
        fast=fast,
        slow=slow,
        hf=hf,
        vocab=vocab,
        model=model,
        model_dir=model_dir,
        fast_logits=fast_logits,
        slow_logits=slow_logits,
    )
    for section in MODEL_SECTIONS:
        try:
            section(**ctx)
        except Exception as exc:  # one broken section must not hide the others
            import traceback

            traceback.print_exc()
            check(f"{section.__name__}_ran", False, error=f"{type(exc).__name__}: {exc}"[:500])


def check_greedy(fast, slow, hf, vocab, fast_logits, slow_logits, **_):
    """Greedy agreement and logit error on 32 tokens."""
    from inferd.engine.bench.gpu_harness import prompts

    lens = (5, 17, 100, 600)
    ps = [prompts(vocab, 1, n, seed=n)[0] for n in lens]
    n_tok = 32 if DEVICE == "cuda" else 4
    f_tok, f_ids = generate(fast, ps, n_tok, "greedy-fast")
    s_tok, s_ids = generate(slow, ps, n_tok, "greedy-slow")
    for i, p in enumerate(ps):
        ids = torch.tensor([p], device=DEVICE)
        with torch.inference_mode():
            h_tok = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n_tok,
                min_new_tokens=n_tok,
                do_sample=False,
                pad_token_id=0,
            )[0, len(p) :].tolist()
            # teacher-forced transformers logits over each engine's own continuation
            ref_f = hf(torch.tensor([p + f_tok[i][:-1]], device=DEVICE)).logits[0, len(p) - 1 :].float().cpu()
            ref_s = hf(torch.tensor([p + s_tok[i][:-1]], device=DEVICE)).logits[0, len(p) - 1 :].float().cpu()
        err_f = max(rel(a, b) for a, b in zip(fast_logits[f_ids[i]], ref_f))
        err_s = max(rel(a, b) for a, b in zip(slow_logits[s_ids[i]], ref_s))
        n_same = agree(f_tok[i], s_tok[i])
        err_fs = max([rel(a, b) for a, b in zip(fast_logits[f_ids[i]][: n_same + 1], slow_logits[s_ids[i]])] or [0])
        # Pass: as close to transformers as the portable path is (bf16 noise sets both; on a
        # shallow model the portable path, which computes as transformers does, can be far
        # closer than one bf16 kernel's rounding, so that rounding is the floor), and greedy
        # agreement with transformers whenever the portable path itself agrees fully.
        portable_agrees = agree(s_tok[i], h_tok) == n_tok
        check(
            f"greedy32_prompt{lens[i]}",
            err_f <= max(NOISE_RATIO * err_s, BF16_REL_TOL)
            and (agree(f_tok[i], h_tok) == n_tok or not portable_agrees or DTYPE_NAME == "bfloat16"),
            fast_vs_hf_agree=agree(f_tok[i], h_tok),
            fast_vs_fallback_agree=n_same,
            fallback_vs_hf_agree=agree(s_tok[i], h_tok),
            logit_rel_err_fast_vs_hf=err_f,
            logit_rel_err_fallback_vs_hf=err_s,
            logit_rel_err_fast_vs_fallback=err_fs,
        )
    graphs = fast.runner.fast_decode
    check(
        "decode_ran_in_graphs",
        (graphs.num_replays > 0 or DEVICE == "cpu") and fast.runner.mode == "fast",
        replays=graphs.num_replays,
        graphs=sorted(graphs.graphs),
    )


def check_batch_invariance(fast, vocab, fast_logits, **_):
    """One prompt alone, in a batch of 8, in a batch of 40 (graph 64); graphs against eager."""
    from inferd.engine.bench.gpu_harness import prompts

    graphs = fast.runner.fast_decode
    n_others, n_tok = (39, 16) if DEVICE == "cuda" else (9, 3)
    probe = prompts(vocab, 1, 300, seed=99)[0]
    alone, alone_ids = generate(fast, [probe], n_tok, "inv1")
    others = prompts(vocab, n_others, 200, seed=7)
    in8, ids8 = generate(fast, [probe] + others[:7], n_tok, "inv8")
    in40, ids40 = generate(fast, [probe] + others, n_tok, "inv40")
    a8, a40 = agree(alone[0], in8[0]), agree(alone[0], in40[0])
    e8 = max(rel(a, b) for a, b in zip(fast_logits[ids8[0]][: a8 + 1], fast_logits[alone_ids[0]]))
    e40 = max(rel(a, b) for a, b in zip(fast_logits[ids40[0]][: a40 + 1], fast_logits[alone_ids[0]]))
    # Not bitwise: the prefill's matmul shapes change with the batch (b40 also prefills in
    # chunks, so its first decodes run in mixed eager steps). bf16 gave b8 exactly equal,
    # fp16 a 0.3 % difference; pass when the logits stay within the model's noise level
    # until the first flipped token.
    check(
        "batch_invariance",
        e8 < MODEL_REL_TOL and e40 < MODEL_REL_TOL,
        logit_rel_diff_b8=e8,
        logit_rel_diff_b40_until_first_flip=e40,
        agree_b8=a8,
        agree_b40=a40,
    )

    # c. graphs against eager fast decode (same kernels, no capture)
    graphs.use_graphs = False
    eager, eager_ids = generate(fast, [probe], n_tok, "eager")
    graphs.use_graphs = DEVICE == "cuda"
    e = max(rel(a, b) for a, b in zip(fast_logits[eager_ids[0]], fast_logits[alone_ids[0]]))
    check("graphs_match_eager", eager[0] == alone[0] and e < 1e-3, logit_rel_diff=e)


def check_contexts(fast, slow, vocab, fast_logits, slow_logits, **_):
    """Contexts across block and split boundaries, end to end."""
    from inferd.engine.bench.gpu_harness import prompts

    for n in CONTEXTS if DEVICE == "cuda" else (1, 15, 16, 17, 40):
        p = prompts(vocab, 1, n, seed=1000 + n)[0]
        ft, fid = generate(fast, [p], 4, f"ctx{n}-fast")
        st, sid = generate(slow, [p], 4, f"ctx{n}-slow")
        same = agree(ft[0], st[0])
        errs = [rel(a, b) for a, b in zip(fast_logits[fid[0]][: same + 1], slow_logits[sid[0]])]
        check(f"context_{n}", max(errs) < MODEL_REL_TOL, agree=same, logit_rel_err_until_first_flip=errs)


def check_prefix_rows(model_dir, model, slow, vocab, slow_logits, **_):
    """New tokens after a cached prefix as rows of the decode graphs (cuda_graphs.py)
    and through the eager forward, each against the portable path on the same prompt."""
    from inferd.engine.bench.gpu_harness import new_engine, prompts

    cuda = DEVICE == "cuda"
    engine = new_engine(
        model_dir,
        model,
        "fast",
        kv_gib=8 if cuda else 0.02,
        max_num_batched_tokens=2048,
        enable_prefix_caching=True,
        async_scheduling=False,
    )
    logits = record_logits(engine)
    graphs = engine.runner.fast_decode
    prefix = prompts(vocab, 1, 1024 if cuda else 48, seed=77)[0]
    generate(engine, [prefix + [5]], 1, "prefix-fill")  # the prefix enters the cache
    # 32 new tokens: packs of the small size; 100: large packs (cuda_graphs.LARGE_PACK_MIN_ROWS)
    ways = (("graph_rows", graphs.max_batch, 32), ("graph_rows_100", graphs.max_batch, 100), ("eager", 0, 32))
    for i, (way, rows, new_tokens) in enumerate(ways):
        graphs.max_expanded_rows = rows
        expanded, hits, large = graphs.num_expanded, engine.block_manager.prefix.hits, graphs.num_large_packed
        prompt = prefix + prompts(vocab, 1, new_tokens, seed=78 + i)[0]
        ft, fid = generate(engine, [prompt], 8, f"prefix-{way}")
        st, sid = generate(slow, [prompt], 8, f"prefix-{way}-slow")
        same = agree(ft[0], st[0])
        errs = [rel(a, b) for a, b in zip(logits[fid[0]][: same + 1], slow_logits[sid[0]])]
        took_rows = graphs.num_expanded > expanded
        in_large = graphs.num_large_packed > large
        wants_large = rows > 0 and new_tokens >= 64 and graphs.large_rows_per_pack > graphs.rows_per_pack
        check(
            f"prefix_{way}",
            max(errs) < MODEL_REL_TOL
            and took_rows == (rows > 0)
            and in_large == wants_large
            and engine.block_manager.prefix.hits > hits,
            agree=same,
            logit_rel_err_until_first_flip=errs,
            ran_as_graph_rows=took_rows,
            in_large_packs=in_large,
        )
    del engine


def check_mixed_prompts_after_prefix(model_dir, model, slow, vocab, slow_logits, **_):
    """A lone short chunk after a cached prefix (6 rows: less than one pack of a multi-head
    model), then eight prompts of mixed lengths after it at once: on the fast path, strict
    (INFERD_FASTPATH_STRICT: a bug in our launch code raises and fails this section instead
    of running portable), never leaving it; each against the portable path on its prompt."""
    from inferd.engine.bench.gpu_harness import new_engine, prompts
    from inferd.engine.runner.fastpath_faults import STRICT_ENV

    cuda = DEVICE == "cuda"
    engine = new_engine(
        model_dir,
        model,
        "fast",
        kv_gib=8 if cuda else 0.02,
        max_num_batched_tokens=2048,
        enable_prefix_caching=True,
        async_scheduling=False,
    )
    logits = record_logits(engine)
    graphs = engine.runner.fast_decode
    prefix = prompts(vocab, 1, 512 if cuda else 48, seed=91)[0]
    lengths = (1, 3, 6, 9, 17, 33, 70, 130) if cuda else (1, 2, 3, 5, 6, 7, 9, 12)
    lone = prefix + prompts(vocab, 1, 6, seed=90)[0]
    batch = [prefix + prompts(vocab, 1, n, seed=92 + i)[0] for i, n in enumerate(lengths)]
    with mock.patch.dict(os.environ, {STRICT_ENV: "1"}):
        generate(engine, [prefix + [5]], 1, "mixed-fill")  # the prefix enters the cache
        expanded, hits = graphs.num_expanded, engine.block_manager.prefix.hits
        lone_tokens, lone_ids = generate(engine, [lone], 8, "mixed-lone")
        batch_tokens, batch_ids = generate(engine, batch, 8, "mixed-batch")
    cases = [("lone6", lone, lone_tokens[0], lone_ids[0])]
    cases += [(f"len{n}", p, t, r) for n, p, t, r in zip(lengths, batch, batch_tokens, batch_ids)]
    for tag, prompt, tokens, rid in cases:
        want, want_ids = generate(slow, [prompt], 8, f"mixed-{tag}-slow")
        same = agree(tokens, want[0])
        errs = [rel(a, b) for a, b in zip(logits[rid][: same + 1], slow_logits[want_ids[0]])]
        check(f"mixed_after_prefix_{tag}", max(errs) < MODEL_REL_TOL, agree=same, logit_rel_err_until_first_flip=errs)
    counters = engine.counters
    check(
        "mixed_after_prefix_stays_fast",
        engine.runner.mode == "fast"
        and not counters.fastpath_failures
        and not counters.fastpath_launch_errors
        and graphs.num_expanded > expanded
        and engine.block_manager.prefix.hits > hits,
        mode=engine.runner.mode,
        failures=dict(counters.fastpath_failures),
        launch_errors=dict(counters.fastpath_launch_errors),
        steps_as_graph_rows=graphs.num_expanded - expanded,
        packs=(graphs.rows_per_pack, graphs.large_rows_per_pack),
    )
    del engine


def check_cold_kv(model_dir, model, vocab, **_):
    """int8 and int4 cold KV on the fast path (cold graphs, the two-run kernel, prefill
    over cold blocks) against the portable attention over the same cold blocks."""
    from inferd.engine.bench.gpu_harness import free_dropped_engines, new_engine, prompts
    from inferd.engine.model.attention import paged_attention

    lens = (600, 2000) if DEVICE == "cuda" else (40, 70)
    ps = [prompts(vocab, 1, n, seed=2000 + n)[0] for n in lens]
    for kind in ("int8", "int4"):
        common = dict(
            kv_gib=8 if DEVICE == "cuda" else 0.02,
            max_num_batched_tokens=512,
            kv_cold_dtype=kind,
            kv_hot_window=64 if DEVICE == "cuda" else 16,
            enable_prefix_caching=False,
            max_model_len=4096 if DEVICE == "cuda" else 256,
            async_scheduling=False,
        )  # record_logits sees every decode step's logits
        fast = new_engine(model_dir, model, "fast", **common)
        ref = new_engine(model_dir, model, "fast", **common)
        ref.runner.fast_decode, ref.runner.fast_attention = None, paged_attention  # cooling on, portable attention
        f_logits, r_logits = record_logits(fast), record_logits(ref)
        f_tok, f_ids = generate(fast, ps, 16, f"cold-{kind}-fast")
        r_tok, r_ids = generate(ref, ps, 16, f"cold-{kind}-ref")
        graphs = fast.runner.fast_decode
        cold_graphs = sorted(key for key in graphs.graphs if key[1]) if graphs is not None else []
        for i, n in enumerate(lens):
            same = agree(f_tok[i], r_tok[i])
            errs = [rel(a, b) for a, b in zip(f_logits[f_ids[i]][: same + 1], r_logits[r_ids[i]])]
            check(
                f"cold_{kind}_prompt{n}",
                max(errs) < MODEL_REL_TOL and fast.runner.mode == "fast",
                agree=same,
                logit_rel_err_until_first_flip=errs,
                quantized_blocks=fast.counters.quantized_blocks[kind],
            )
        check(
            f"cold_{kind}_decode_in_graphs",
            DEVICE == "cpu" or (graphs.num_replays > 0 and bool(cold_graphs)),
            replays=graphs.num_replays if graphs is not None else 0,
            cold_graphs=len(cold_graphs),
        )
        del fast, ref
        free_dropped_engines()


def check_sampling(fast, vocab, fast_logits, **_):
    """The batched sampler on the device: the same batch with the same seeds repeats
    exactly; penalties, top-k/p, min-p and logprobs run; the engine stays on the fast
    path. A seeded request alone against the same request beside unseeded ones is
    reported: in bf16 the two batches run different graph sizes whose logits differ
    slightly, which may change a sampled token; the check records whether every
    difference follows a logit difference (numerics) rather than a sampler one."""
    from inferd.engine import SamplingParams
    from inferd.engine.bench.gpu_harness import prompts

    ps = prompts(vocab, 6, 40, seed=77)
    seeded = [
        SamplingParams(
            temperature=0.8,
            top_p=0.9,
            top_k=50,
            min_p=0.02,
            repetition_penalty=1.1,
            presence_penalty=0.2,
            max_tokens=16,
            seed=100 + i,
            logprobs=2,
            ignore_eos=True,
        )
        for i in range(3)
    ]
    unseeded = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)

    def run(tag, batch):
        ids = []
        for i, (p, params) in enumerate(batch):
            fast.add_request(f"{tag}-{i}", p, params)
            ids.append(f"{tag}-{i}")
        done = {}
        while fast.has_unfinished():
            for out in fast.step():
                if out.finished:
                    done[out.request_id] = out.outputs[0]
        return [done[r] for r in ids]

    mixed = list(zip(ps[:3], seeded)) + [(p, unseeded) for p in ps[3:]]
    first = run("sample-a", mixed)
    repeat = run("sample-r", mixed)
    alone = run("sample-b", list(zip(ps[:3], seeded)))
    same_batch = [a.token_ids == b.token_ids for a, b in zip(first[:3], repeat[:3])]
    ok_logprobs = all(o.logprobs is not None and len(o.logprobs) == 16 for o in first[:3])
    in_vocab = all(0 <= t < vocab and len(o.token_ids) == 16 for o in first for t in o.token_ids)
    explained = []
    for i, (a, b) in enumerate(zip(first[:3], alone)):
        n = agree(a.token_ids, b.token_ids)
        if n == len(a.token_ids):
            explained.append(None)  # identical
            continue
        la, lb = fast_logits[f"sample-a-{i}"], fast_logits[f"sample-b-{i}"]
        explained.append(max(rel(x, y) for x, y in zip(la[: n + 1], lb[: n + 1])))
    check(
        "sampling_on_device",
        all(same_batch) and ok_logprobs and in_vocab and fast.runner.mode == "fast",
        same_batch_repeats=same_batch,
        logprobs=ok_logprobs,
        in_vocab=in_vocab,
        mode=fast.runner.mode,
        alone_vs_mixed_agree=[agree(a.token_ids, b.token_ids) for a, b in zip(first[:3], alone)],
        logit_rel_diff_until_first_difference=explained,
    )


def check_async_scheduling(fast, vocab, model_dir, model, **_):
    """Decode steps launched ahead on the device's tokens (async scheduling) give the same
    greedy tokens as synchronous steps: requests of different lengths and limits, so rows
    leave the batch while steps are in flight."""
    from inferd.engine import SamplingParams
    from inferd.engine.bench.gpu_harness import free_dropped_engines, new_engine, prompts

    ahead = new_engine(
        model_dir,
        model,
        "fast",
        kv_gib=20 if DEVICE == "cuda" else 0.02,
        max_num_batched_tokens=2048,
        enable_prefix_caching=False,
    )
    fed = []
    launch = ahead.runner.launch_greedy_decode
    ahead.runner.launch_greedy_decode = lambda batch, rb, fed_ids=None, **kwargs: (
        fed.append(fed_ids is not None),
        launch(batch, rb, fed_ids=fed_ids, **kwargs),
    )[1]
    ps = [p[: 5 + 37 * i] for i, p in enumerate(prompts(vocab, 8, 300, seed=55))]
    got, want = [], []
    for engine, out in ((ahead, got), (fast, want)):
        for i, p in enumerate(ps):
            engine.add_request(
                f"async-{id(engine)}-{i}", p, SamplingParams(temperature=0.0, max_tokens=8 + 3 * i, ignore_eos=True)
            )
        done = {}
        while engine.has_unfinished():
            done.update((o.request_id, o.outputs[0].token_ids) for o in engine.step() if o.finished)
        out.extend(done[f"async-{id(engine)}-{i}"] for i in range(len(ps)))
    check(
        "async_scheduling_same_tokens",
        got == want and sum(fed) > 0 and ahead.runner.mode == "fast",
        identical_requests=sum(a == b for a, b in zip(got, want)),
        requests=len(ps),
        launches_fed_from_device=sum(fed),
        launches=len(fed),
        mode=ahead.runner.mode,
    )
    del ahead
    free_dropped_engines()


def check_injected_failure(fast, slow, vocab, **_):
    """An injected failure mid-decode: fallback, same tokens, counted; then back to fast."""
    from inferd.engine import SamplingParams
    from inferd.engine.bench.gpu_harness import prompts

    ps2 = [prompts(vocab, 1, 50, seed=5)[0], prompts(vocab, 1, 70, seed=6)[0]]
    want, _ = generate(slow, ps2, 12, "inject-ref")
    for i, p in enumerate(ps2):
        fast.add_request(f"inject-{i}", p, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    fast.step()
    fast.step()
    fast.runner.inject_fastpath_failure("device check")
    got = {}
    while fast.has_unfinished():
        got.update((o.request_id, o.outputs[0].token_ids) for o in fast.step() if o.finished)
    # Tokens before the switch come from the fast path, so bf16 noise may flip one; the
    # switch itself must lose nothing: every request completes, on the portable path.
    check(
        "injected_failure_falls_back",
        all(len(got[f"inject-{i}"]) == 12 for i in range(2))
        and fast.runner.mode == "fallback"
        and fast.counters.fastpath_failures["injected"] == 1,
        mode=fast.runner.mode,
        failures=dict(fast.counters.fastpath_failures),
        agree_with_fallback=[agree(got[f"inject-{i}"], want[i]) for i in range(2)],
    )
    fast.reconfigure({"mode": "fast"})  # the runner reads the mode from the engine's config


def quick_timing(fast, slow, vocab, model, **_):
    """Batch-1 decode, fast and fallback; bare graph replays."""
    if DEVICE == "cpu":
        return
    from inferd.engine.bench.gpu_decode import (
        ModelCost,
        bench_engine_decode,
        bench_graph_replay,
        measure_ceilings,
        prompts,
    )

    ceil = measure_ceilings(torch.device("cuda"))
    cost = ModelCost(model.config)
    p512 = prompts(vocab, 1, 512, seed=3)
    b1 = bench_engine_decode(fast, p512, 128)
    replay = bench_graph_replay(fast, 1, 576)
    per_token_bytes = cost.weight_bytes_read + 576 * cost.kv_bytes_per_token
    slow_b1 = bench_engine_decode(slow, p512, 32)
    results["timing"]["decode_b1"] = {
        "fast_engine_tok_s": b1["decode_tok_s"],
        "fast_engine_mbu": b1["decode_tok_s"] * per_token_bytes / ceil["copy_bytes_per_s"],
        "graph_replay_ms": replay * 1e3,
        "graph_mbu": per_token_bytes / replay / ceil["copy_bytes_per_s"],
        "fallback_tok_s": slow_b1["decode_tok_s"],
        "copy_bytes_per_s": ceil["copy_bytes_per_s"],
        "matmul_flops_per_s": ceil["matmul_flops_per_s"],
    }
    results["timing"]["replay_b256_ctx576_ms"] = bench_graph_replay(fast, 256, 576) * 1e3
    log(f"timing {json.dumps(results['timing'])}")


def time_fused_ops() -> None:
    """Triton kernels against torch.compile of the same maths and eager, at batch 1 and 256."""
    from triton.testing import do_bench

    from inferd.engine.fast_path import fused_ops as ops

    out = {}
    dt = torch.bfloat16
    for rows in (1, 256):
        x = torch.randn(rows, 4096, device="cuda", dtype=dt)
        res = torch.randn(rows, 4096, device="cuda", dtype=dt)
        w = torch.randn(4096, device="cuda", dtype=dt)
        gu = torch.randn(rows, 2 * 14336, device="cuda", dtype=dt)
        compiled_norm = torch.compile(ops.add_rms_norm_reference)
        compiled_silu = torch.compile(ops.silu_and_mul_reference)
        cases = {
            "add_rms_norm": {
                "triton": lambda: ops.add_rms_norm(x, res, w, 1e-5),
                "compile": lambda: compiled_norm(x, res, w, 1e-5),
                "eager": lambda: ops.add_rms_norm_reference(x, res, w, 1e-5),
            },
            "silu_and_mul": {
                "triton": lambda: ops.silu_and_mul(gu),
                "compile": lambda: compiled_silu(gu),
                "eager": lambda: ops.silu_and_mul_reference(gu),
            },
        }
        for op, variants in cases.items():
            for name, fn in variants.items():
                try:
                    out[f"{op}_rows{rows}_{name}_us"] = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
                except Exception as exc:  # torch.compile may fail on the image; record it
                    out[f"{op}_rows{rows}_{name}_us"] = f"{type(exc).__name__}: {exc}"[:200]
    results["timing"]["fused_ops"] = out
    log(f"fused ops {json.dumps(out)}")


MODEL_SECTIONS = [
    check_greedy,
    check_batch_invariance,
    check_contexts,
    check_cold_kv,
    check_sampling,
    check_async_scheduling,
    check_injected_failure,
    check_prefix_rows,
    check_mixed_prompts_after_prefix,
    quick_timing,
]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny preset: exercise the Python code only")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument(
        "--model-sections",
        help="comma-separated subset of the model sections, e.g. "
        "check_greedy,check_batch_invariance (kernel checks and op timing then skipped)",
    )
    parser.add_argument(
        "--shape", default="llama3-8b-shape", choices=sorted(SHAPES), help="the model the model sections run on"
    )
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    global DEVICE, PRESET, DTYPE_NAME, MODEL_SECTIONS, SHAPE
    DTYPE_NAME, SHAPE = args.dtype, args.shape
    if args.model_sections:
        names = args.model_sections.split(",")
        unknown = [n for n in names if n not in {f.__name__ for f in MODEL_SECTIONS}]
        if unknown:
            parser.error(f"unknown model sections {unknown}; known: {[f.__name__ for f in MODEL_SECTIONS]}")
        MODEL_SECTIONS = [f for f in MODEL_SECTIONS if f.__name__ in names]
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        DEVICE, PRESET = "cpu", "tiny"
        steps = (check_model,)
    else:
        from inferd.engine.bench.gpu_harness import environment

        results["env"] = environment()
        log(json.dumps(results["env"]))
        steps = (
            (check_model,)
            if args.model_sections
            else (check_attention_kernel, check_attention_shapes, check_fused_ops, check_model, time_fused_ops)
        )
    for step in steps:
        try:
            step()
        except Exception as exc:  # keep going: one broken step must not hide the others
            import traceback

            traceback.print_exc()
            check(f"{step.__name__}_ran", False, error=f"{type(exc).__name__}: {exc}"[:500])
        suffix = "" if SHAPE == "llama3-8b-shape" else f"_{SHAPE}"
        with open(f"{args.out}/check_{DTYPE_NAME}{suffix}.json", "w") as f:
            json.dump(results, f, indent=2, default=str)
    print("\nFAILED: " + ", ".join(failures) if failures else "\nall checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
