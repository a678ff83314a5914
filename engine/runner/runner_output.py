"""What a model runner hands back for one executed batch (vLLM V1's ModelRunnerOutput, in small).

The engine reads a step's results only from here: a runner keeps no per-step state
for the engine to fetch afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..request.prompt_logprobs import PromptLogprobsChunk


@dataclass(frozen=True, slots=True)
class RunnerOutput:
    # [num sampling sequences, vocab] float32 in batch order; [0, 0] when no row samples.
    logits: torch.Tensor
    # Greedy tokens the fast decode step already read back together with its finiteness
    # check (one host synchronisation for both); the engine uses them instead of sampling.
    sampled_token_ids: list[int] | None = None
    # Otherwise the fast decode step's finiteness check, still on the device (0-d, nonzero
    # when every logit is finite), for the sampler to read with its tokens; zero there
    # means the step runs again on the portable path. None: the logits were checked
    # already (or, on the portable path, need no check).
    finite: torch.Tensor | None = None
    # Per batch item, the prompt tokens its chunk scored (engine/request/prompt_logprobs.py), None
    # where it scored none; None when no item asked for prompt logprobs.
    prompt_logprobs: list[PromptLogprobsChunk | None] | None = None
