"""The burst's offline side: the engine in this process, every request submitted at
once and stepped to the end, with each request's first-token time recorded."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import torch

from ..llm import LLM
from ..request.sampling_params import SamplingParams
from .burst_sampling import greedy_params


@dataclass(slots=True)
class OfflineResult:
    wall_s: float  # submission of the first request to the last one's finish
    first_token: list[float]  # per request, seconds from submission
    first_text: list[float]  # per request, first output with non-empty text (what a stream can show)
    num_tokens: list[int]  # output tokens per request


def run_offline(
    model_dir: str,
    engine_options: dict,
    prompts: list[list[int]],
    output_len: int,
    warmup_prompts: list[list[int]],
    warmup_output_len: int,
    sampled: tuple[list[list[int]], list[dict]] | None = None,
) -> tuple[OfflineResult, OfflineResult | None]:
    """Warm up, then the greedy burst and, with `sampled` (its prompts and per-request
    sampling fields), the sampled one on the same engine; the engine is freed (GPU memory
    included) on return, so a server started next can have the memory."""
    llm = LLM(model_dir, **engine_options)
    try:
        if warmup_prompts:
            llm.generate(warmup_prompts, SamplingParams(temperature=0.0, max_tokens=warmup_output_len, ignore_eos=True))
        gc.collect()
        gc.freeze()  # as the server does after start-up: no full collections over the engine's objects
        greedy = offline_burst(llm.engine, prompts, output_len, greedy_params(len(prompts)))
        return greedy, offline_burst(llm.engine, sampled[0], output_len, sampled[1]) if sampled else None
    finally:
        del llm
        gc.unfreeze()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def offline_burst(engine, prompts: list[list[int]], output_len: int, sampling: list[dict]) -> OfflineResult:
    n = len(prompts)
    first_token, first_text, num_tokens = [float("nan")] * n, [float("nan")] * n, [0] * n
    index: dict[str, int] = {}
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        rid = f"burst-{i}"
        index[rid] = i
        engine.add_request(rid, prompt, SamplingParams(max_tokens=output_len, ignore_eos=True, **sampling[i]))
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
