"""One API request as the server runs it: its prompts, sampling parameters and ids (`Job`),
and what each streamed choice has sent so far (`ChoiceState`).

A completions request may carry a batch of prompts; a chat request has one. Each prompt
runs `params.n` sequences, so choice `i * n + j` is prompt i's j-th sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..request.sampling_params import SamplingParams
from ..request.slo import RequestSlo, SloClass
from .tool_parsers import ToolCallStream, ToolParser
from .tool_parsers.tool_choice import ToolRequest


@dataclass(slots=True)
class Prompt:
    text: str | list[int]
    token_ids: list[int]


@dataclass(slots=True)
class ChoiceState:
    sent_chars: int = 0
    sent_tokens: int = 0
    started: bool = False
    done: bool = False
    tool_stream: ToolCallStream | None = None


@dataclass(slots=True)
class Job:
    """One API request: its prompts (a batch for completions), params and ids."""

    request_id: str
    created: int
    model: str
    prompts: list[Prompt]
    params: SamplingParams
    priority: int
    slo_class: SloClass
    stream: bool
    include_usage: bool
    continuous_usage: bool
    chat: bool
    top_logprobs: int | None = None
    trace_headers: dict[str, str] | None = None
    states: dict[tuple[int, int], ChoiceState] = field(default_factory=dict)
    tools: ToolRequest | None = None
    tool_parser: ToolParser | None = None
    """Set when the choices' text is parsed for tool calls."""
    echo: bool = False  # completions: the prompt comes first in each choice's text and logprobs
    echo_only: bool = False  # echo with max_tokens 0: the one token the engine generates is dropped
    prompt_logprobs: int | None = None  # the request's prompt_logprobs (the response field)
    slo: RequestSlo | None = None  # set when the job is queued (its deadline counts from then)
    predicted_ttft_s: float | None = None  # admission's prediction, None without a measured rate

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p.token_ids) for p in self.prompts)

    @property
    def num_seqs(self) -> int:
        return len(self.prompts) * self.params.n
