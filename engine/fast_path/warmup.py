"""Compile the prefill path's Triton kernels when the engine starts.

The decode graphs are captured at start (cuda_graphs.py); prefill and mixed steps run
the same fused ops eagerly, and Triton compiles a kernel variant the first time it sees
a new specialisation (pointer alignment, integer arguments divisible by 16 or not). On a
fresh H200 that cost the first two 16 x 512-token prefill steps about 1.3 s (the batch-32
comparison in BENCHMARKS.md: 2.20 s before, 0.93 s after). Two synthetic steps cover both specialisations of the token count:
each holds a fresh prompt, a chunk after a cached prefix and a decode row (the mixed
step's decode kernel). Every slot is the padding slot, so no K/V is written; the
attention reads block 0, whatever it holds, and the results are thrown away.

CUDA loads each kernel's module the first time the kernel runs (lazy loading), and
some of those loads are long: on the H200 the first eager step's finiteness check of
its logits took 75 ms, and flash attention's split kernel, first used by a lone prompt
of 300 tokens, 93 ms. So the warm-up also computes logits for two rows of each step,
checks them and takes their argmax as the runner and the greedy sampler do; a lone
prompt of 384 tokens meets the split kernel; and a last step fills the step budget
(`max_num_batched_tokens`) with fresh prompts, growing the allocator's pools to their
peak and meeting cuBLAS's largest shapes. With the budget step alone, the first 16 x
512-token step still took 261 ms against 184-187 ms for the steps after it
(benchmarks/results/2026-12-04-h200-warmup-g26-g27.json, first_steps_ms).
"""

from __future__ import annotations

import torch

from ..model.attention import AttentionMetadata
from .cuda_graphs import PAD_SLOT

# (query length, context length) per sequence of each warm-up step
WARMUP_STEPS = (((17, 17), (16, 48), (1, 33)), ((16, 16), (15, 31), (1, 70)), ((384, 384),))
BUDGET_PROMPT_TOKENS = 512
"""The fresh prompts of the budget step are this long (the last one shorter), at most
max_model_len."""


def budget_step(max_step_tokens: int, max_model_len: int) -> tuple[tuple[int, int], ...]:
    """(query length, context length) of the fresh prompts that fill a step of
    `max_step_tokens` tokens; () for no budget step."""
    piece = min(BUDGET_PROMPT_TOKENS, max_model_len or BUDGET_PROMPT_TOKENS)
    if max_step_tokens <= 0 or piece <= 0:
        return ()
    full, rest = divmod(max_step_tokens, piece)
    return ((piece, piece),) * full + (((rest, rest),) if rest else ())


@torch.inference_mode()
def warm_prefill_kernels(
    decoder, attention_fn, block_size: int, device: torch.device, max_step_tokens: int = 0, max_model_len: int = 0
) -> None:
    """Run the warm-up steps (and with `max_step_tokens`, the budget step last)."""
    budget = budget_step(max_step_tokens, max_model_len)
    for step in WARMUP_STEPS + ((budget,) if budget else ()):
        meta = synthetic_metadata(step, block_size, device)
        tokens = sum(n for n, _ in step)
        hidden = decoder.forward_step(torch.zeros(tokens, dtype=torch.long, device=device), meta, attention_fn)
        logits = decoder.model.compute_logits(hidden[[0, tokens - 1]])  # as ModelRunner._forward, then the sampler
        bool(torch.isfinite(logits).all())
        logits.argmax(dim=-1).tolist()
    warm_decode_splits(decoder, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_decode_splits(decoder, device: torch.device) -> None:
    """A mixed step's decode rows take as many splits as their count and longest context
    call for (choose_num_splits), and the split count is a compile-time constant of the
    kernel: compile every power of two up to MAX_SPLITS now. (On the H200 the first
    256 x 512-token run after start spent 1.7 s more in its prefill phase than the runs
    after it; this saved 0.4 s of that, excluding cuDNN's attention the rest:
    attention/prefill.py.)"""
    from .attention import MAX_SPLITS, cold_paged_decode_attention, paged_decode_attention  # Triton kernels

    k_cache, v_cache, cold = decoder.kv_layers[0]
    q = torch.zeros(1, decoder.num_heads, decoder.head_dim, dtype=k_cache.dtype, device=device)
    tables = torch.zeros(1, 16, dtype=torch.int32, device=device)
    context_lens = torch.full((1,), 33, dtype=torch.long, device=device)
    splits = 1
    while splits <= MAX_SPLITS:
        paged_decode_attention(q, k_cache, v_cache, tables, context_lens, decoder.scale, splits)
        if decoder.cold_kinds():  # with cold KV, a mixed step's decode rows take the per-tile cold kernel
            cold_paged_decode_attention(
                q,
                k_cache,
                v_cache,
                cold,
                tables,
                torch.zeros_like(tables),
                torch.zeros_like(tables),
                context_lens,
                decoder.scale,
                splits,
            )
        splits *= 2


def synthetic_metadata(step, block_size: int, device: torch.device) -> AttentionMetadata:
    query_start: list[int] = []
    positions: list[int] = []
    start = 0
    for n, ctx in step:
        query_start.append(start)
        positions += range(ctx - n, ctx)
        start += n
    max_blocks = -(-max(-(-ctx // block_size) for _, ctx in step) // 16) * 16  # int32, 16-aligned, as in prepare()
    return AttentionMetadata(
        query_start=query_start,
        query_lens=[n for n, _ in step],
        context_lens=torch.tensor([ctx for _, ctx in step], device=device),
        block_tables=torch.zeros(len(step), max_blocks, dtype=torch.int32, device=device),
        slot_mapping=torch.full((start,), PAD_SLOT, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        max_query_len=max(n for n, _ in step),
        max_context_len=max(ctx for _, ctx in step),
    )
