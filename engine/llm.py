"""Offline API, shaped like vLLM's: `LLM(model=DIR, **config).generate(prompts, params)`."""

from __future__ import annotations

import itertools

from .config import EngineConfig
from .llm_engine import LLMEngine
from .request.outputs import RequestOutput
from .request.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str, **config):
        self.engine = LLMEngine(EngineConfig.from_dict({"model": model, **config}))
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self, prompts, params: SamplingParams | list[SamplingParams] | None = None, priorities: list[int] | None = None
    ) -> list[RequestOutput]:
        """`prompts`: a string, a list of token ids, or a list of either. One result per
        prompt, in order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(params_list)} SamplingParams for {len(prompts)} prompts")
        priorities = priorities or [0] * len(prompts)
        ids = []
        for prompt, p in zip(prompts, params_list):
            self.engine.validate_request(prompt, p)  # fail before anything is queued
        for prompt, p, prio in zip(prompts, params_list, priorities):
            rid = f"offline-{next(self._ids)}"
            self.engine.add_request(rid, prompt, p, priority=prio)
            ids.append(rid)
        results: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.finished:
                    results[out.request_id] = out
        return [results[i] for i in ids]
