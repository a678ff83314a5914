"""The burst's offline side: the engine in this process, every request submitted at
once and stepped to the end, with each request's first-token time recorded; and the
random checkpoint both sides load."""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(slots=True)
class OfflineResult:
    wall_s: float  # submission of the first request to the last one's finish
    first_token: list[float]  # per request, seconds from submission
    first_text: list[float]  # per request, first output with non-empty text (what a stream can show)
    num_tokens: list[int]  # output tokens per request


def write_random_checkpoint(out_dir: str | Path, preset: str, dtype: str, device: str, seed: int = 0) -> Path:
    """make_model's checkpoint for `preset`, the weights drawn on `device`: the GPU draws
    llama3-8b-shape's 16 GB in seconds, where make_model's CPU generator takes minutes.
    Written to disk because the server is another process and loads from there.

    llama3-8b-shape keeps Llama 3's 128,256-row LM head but make_model's tokenizer has
    4,096 tokens, and ids past the tokenizer decode to no text: greedy decoding on random
    weights then streams about two chunks per request instead of one per token (measured
    on the H200), and the streaming phase would skip the per-token work it is there to
    measure. So the head's rows past the tokenizer are zeroed: their logits are exactly
    0 while the others spread with a std of about 4, and the argmax stays inside the
    tokenizer. The head is as large as before, so every step computes the same."""
    from tokenizers import Tokenizer

    from ..make_model import save_weights
    from .random_model import random_model_on_device, write_checkpoint_stub

    out = write_checkpoint_stub(out_dir, preset=preset, dtype=dtype)
    model = random_model_on_device(out, getattr(torch, dtype), torch.device(device), seed=seed)
    visible = Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    if model.lm_head.weight is not model.embed_tokens.weight:  # (stubs are untied; tied rows are the embedding)
        with torch.no_grad():
            model.lm_head.weight[visible:].zero_()
    weights = {(n if n.startswith("lm_head") else "model." + n): p.detach().cpu()
               for n, p in model.named_parameters()}
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    save_weights(weights, out, shard_bytes=4 << 30)  # shards keep safetensors' write buffers small
    return out


def run_offline(model_dir: str, engine_options: dict, prompts: list[list[int]], output_len: int,
                warmup_prompts: list[list[int]], warmup_output_len: int) -> OfflineResult:
    """Warm up, then the burst; the engine is freed (GPU memory included) on return, so
    a server started next can have the memory."""
    from .. import LLM, SamplingParams

    llm = LLM(model_dir, **engine_options)
    try:
        if warmup_prompts:
            llm.generate(warmup_prompts, SamplingParams(temperature=0.0, max_tokens=warmup_output_len,
                                                        ignore_eos=True))
        gc.collect()
        gc.freeze()  # as the server does after start-up: no full collections over the engine's objects
        return _burst(llm.engine, prompts, output_len)
    finally:
        del llm
        gc.unfreeze()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _burst(engine, prompts: list[list[int]], output_len: int) -> OfflineResult:
    from .. import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    n = len(prompts)
    first_token, first_text, num_tokens = [float("nan")] * n, [float("nan")] * n, [0] * n
    index: dict[str, int] = {}
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        rid = f"burst-{i}"
        index[rid] = i
        engine.add_request(rid, prompt, params)
    while engine.has_unfinished():
        outputs = engine.step()
        now = time.perf_counter() - start
        for out in outputs:  # only requests that got a token this step
            i = index[out.request_id]
            if first_token[i] != first_token[i]:  # NaN: its first token
                first_token[i] = now
            completion = out.outputs[0]
            if first_text[i] != first_text[i] and completion.text:
                first_text[i] = now
            if out.finished:
                num_tokens[i] = len(completion.token_ids)  # read once: each read copies the list
    return OfflineResult(time.perf_counter() - start, first_token, first_text, num_tokens)
