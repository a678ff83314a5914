"""Request bodies of the OpenAI-compatible endpoints.

Types are checked here (a wrong type is a malformed request: 400 naming the field, as
OpenAI and vLLM answer it; errors.validation_error); values are checked by
`SamplingParams` (a bad value: 400 naming the parameter), except that every integer
field is bounded to a signed 64-bit integer here (a 400 naming it too). Non-finite
numbers are malformed.
Besides OpenAI's fields, vLLM's sampling extras (top_k, min_p, repetition_penalty,
min_tokens, ignore_eos, stop_token_ids, skip_special_tokens), `priority`, `slo_class` and
`prompt_logprobs` are accepted; completions take `echo` (with `max_tokens` 0: the prompt
alone). Structured outputs (`response_format`, vLLM's `guided_*` and
`structured_outputs`, both routes) and `logit_bias` are checked by
engine/structured_outputs/request.py and params.py.

Unknown fields, at the top level, in `stream_options` and in chat messages alike, are
accepted and ignored as vLLM does, each field name logged once per process
(unknown_fields.py). Refused with 400 `unsupported_parameter` instead, when they carry a
non-default value, are the fields whose loss would silently change the answer: beam
search (`use_beam_search`, and `best_of` other than n), `suffix`, `prompt_embeds`,
`allowed_token_ids`, `bad_words`, `logits_processors`, `vllm_xargs`,
`truncate_prompt_tokens`, `include_stop_str_in_output`, `return_tokens_as_token_ids`,
the chat template's inputs (`chat_template`, `chat_template_kwargs`, `documents`,
`continue_final_message`), legacy `functions`/`function_call`, non-text `modalities` and
`audio`, `kv_transfer_params` and `cache_salt` (prefix-cache isolation). A field this
module declares is never treated as unknown, so declaring one lifts its refusal. Not
refused: `n` > 1 with `stream` (vLLM streams it too), `length_penalty` (it only acts with
beam search), `prediction` (a speed hint); ignored: `add_special_tokens`, which vLLM
honours, but whose default for each route is what this server always does.
"""

from __future__ import annotations

from collections import deque
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationInfo,
)

from ..request.sampling_params import SamplingParams
from ..structured_outputs.limits import StructuredOutputsLimits
from ..structured_outputs.params import StructuredOutputsParams, check_logit_bias
from ..structured_outputs.request import StructuredOutputsRequestError, structured_outputs_from_request
from .errors import bad_request
from .unknown_fields import check_unknown_fields

# The engine core's channel (msgspec) carries signed 64-bit integers; the engine needs no more.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _whole_float_to_int(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _within_int64(value: int, info: ValidationInfo) -> int:
    if INT64_MIN <= value <= INT64_MAX:
        return value
    digits = len(str(abs(value)))
    shown = str(value) if digits <= 40 else f"an integer of {digits} digits"
    # An ApiError, not a ValueError: pydantic passes it on instead of collecting it, so a
    # number out of range gets its own message (a bad value), not pydantic's (a bad type).
    raise bad_request(
        f"{info.field_name}: {shown} is outside the signed 64-bit integer range [{INT64_MIN}, {INT64_MAX}]",
        info.field_name,
    )


# An integer field takes a JSON integer, or a whole number written as a float (7.0), which
# JSON Schema counts as an integer too; never a bool or a string. Every one is bounded to a
# signed 64-bit integer here; a field's own range is checked where its meaning is.
JsonInt = Annotated[StrictInt, BeforeValidator(_whole_float_to_int), AfterValidator(_within_int64)]


# Dividing logits by a tiny penalty overflows them to inf, which breaks the whole batch's draw.
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 100.0


def first_non_unicode(value: Any, where: str = "") -> str | None:
    """The path (`messages[0].content`) of the first string in `value`, key or value, that
    is not valid Unicode text, else None. JSON's `\\ud800` escape parses to a lone
    surrogate, which the tokenizer and the UTF-8 response encoder both refuse; finding it
    here makes it a 400 instead. Breadth-first with a queue, not recursion: free-form
    fields (tools, metadata, unknown ones) may nest as deep as the JSON parser allows."""
    queue = deque([(where, value)])
    while queue:
        path, item = queue.popleft()
        if isinstance(item, str):
            if not _is_unicode(item):
                return path or "body"
        elif isinstance(item, dict):
            for key, sub in item.items():
                if isinstance(key, str) and not _is_unicode(key):
                    return path or "body"  # the key itself cannot be quoted
                queue.append((f"{path}.{key}" if path else str(key), sub))
        elif isinstance(item, (list, tuple)):
            queue.extend((f"{path}[{i}]", sub) for i, sub in enumerate(item))
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Lenient(BaseModel):
    # extra="allow" keeps unknown fields in model_extra, so the handler can check and log them.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    def check_unknown_fields(self, where: str = "", log_as: str | None = None) -> None:
        check_unknown_fields(self.model_extra, where, log_as)


class StreamOptions(_Lenient):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class SamplingFields(_Lenient):
    model: str | None = None
    frequency_penalty: StrictFloat | None = 0.0
    presence_penalty: StrictFloat | None = 0.0
    logit_bias: dict[str, Any] | None = None  # values checked in check_common: a 400 naming logit_bias
    n: JsonInt | None = 1
    seed: JsonInt | None = None
    stop: str | list[str] | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    user: str | None = None
    # vLLM extras
    top_k: JsonInt | None = None
    min_p: StrictFloat | None = None
    repetition_penalty: StrictFloat | None = None
    min_tokens: JsonInt = 0
    ignore_eos: StrictBool = False
    stop_token_ids: list[JsonInt] | None = None
    skip_special_tokens: StrictBool = True
    priority: JsonInt = 0
    slo_class: str | None = None  # a configured SLO class (engine/request/slo.py); else the X-SLO-Class header's
    prompt_logprobs: JsonInt | None = None
    # Structured outputs: OpenAI's, then vLLM's two spellings.
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None

    def check_common(self) -> None:
        # First, so that no later check, message or the tokenizer ever sees a surrogate.
        where = first_non_unicode(self.model_dump(exclude_none=True))
        if where is not None:
            raise bad_request(
                f"{where} is not valid Unicode text (it holds a lone surrogate such as \\ud800); send UTF-8 text",
                where,
                "invalid_encoding",
            )
        self.check_unknown_fields()
        if self.stream_options is not None:
            self.stream_options.check_unknown_fields("stream_options.")
            if not self.stream:
                raise bad_request("stream_options is only allowed when stream is true", "stream_options")
        try:
            check_logit_bias(self.logit_bias)
        except ValueError as exc:
            raise bad_request(str(exc), "logit_bias") from None
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= 20:
            raise bad_request(f"prompt_logprobs must be in [0, 20], got {self.prompt_logprobs}", "prompt_logprobs")

    def sampling_params(
        self,
        max_tokens: int,
        logprobs: int | None,
        prompt_logprobs: int | None = None,
        structured_limits: StructuredOutputsLimits | None = None,
    ) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        # Below GREEDY_BELOW_TEMPERATURE (engine/request/sampling_params.py) a request is greedy.
        temperature = 1.0 if self.temperature is None else self.temperature
        if self.repetition_penalty is not None and not (
            MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY
        ):
            raise bad_request(
                f"repetition_penalty must be in [{MIN_REPETITION_PENALTY}, {MAX_REPETITION_PENALTY}], "
                f"got {self.repetition_penalty!r}",
                "repetition_penalty",
            )
        values: dict[str, Any] = dict(
            n=1 if self.n is None else self.n,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            temperature=temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            min_p=0.0 if self.min_p is None else self.min_p,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            seed=self.seed,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            structured_outputs=self.structured_outputs_params(structured_limits),
            logit_bias=self.logit_bias or None,
        )
        try:
            return SamplingParams(**values)
        except ValueError as exc:
            message = str(exc)
            param = message.split()[0] if message else None
            raise bad_request(message, param) from None

    def structured_outputs_params(
        self, limits: StructuredOutputsLimits | None = None
    ) -> StructuredOutputsParams | None:
        try:
            return structured_outputs_from_request(
                self.response_format,
                self.structured_outputs,
                limits,
                guided_json=self.guided_json,
                guided_regex=self.guided_regex,
                guided_choice=self.guided_choice,
                guided_grammar=self.guided_grammar,
            )
        except StructuredOutputsRequestError as exc:
            raise bad_request(str(exc), exc.param) from None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


Prompt = str | list[JsonInt] | list[str] | list[list[JsonInt]]


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: JsonInt | None = 16
    logprobs: JsonInt | None = None
    echo: StrictBool | None = False
    best_of: JsonInt | None = None
    suffix: str | None = None

    def check(self) -> None:
        self.check_common()
        if self.max_tokens == 0 and not self.echo:
            raise bad_request(
                "max_tokens must be an integer >= 1 (0 only with echo: the prompt and its logprobs), got 0",
                "max_tokens",
            )
        if self.suffix:
            raise bad_request("suffix is not supported by this server", "suffix", "unsupported_parameter")
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise bad_request("best_of must equal n (beam search and best-of sampling are not supported)", "best_of")

    @property
    def num_prompt_logprobs(self) -> int | None:
        """The engine's prompt logprobs: `prompt_logprobs`, and with echo as many as `logprobs`."""
        wanted = [n for n in (self.prompt_logprobs, self.logprobs if self.echo else None) if n is not None]
        return max(wanted) if wanted else None

    @property
    def echo_only(self) -> bool:
        """Echo with max_tokens 0: the prompt (and its logprobs) without a completion."""
        return bool(self.echo) and self.max_tokens == 0

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of prompts (OpenAI accepts one or a batch)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise bad_request("prompt is empty", "prompt")
        if isinstance(p[0], int):
            return [list(p)]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class ChatMessage(_Lenient):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def check_role(self, index: int) -> None:
        if self.role not in CHAT_ROLES:
            raise bad_request(
                f"messages[{index}].role must be one of {', '.join(CHAT_ROLES)}; got {self.role!r}",
                f"messages[{index}].role",
            )

    def text(self, index: int) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for j, part in enumerate(self.content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(
                    f"messages[{index}].content[{j}]: only text parts are supported, got type {part.get('type')!r}",
                    f"messages[{index}].content",
                )
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: JsonInt | None = None
    max_completion_tokens: JsonInt | None = None
    logprobs: StrictBool | None = False
    top_logprobs: JsonInt | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    store: StrictBool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    add_generation_prompt: StrictBool = True

    def check(self) -> None:
        self.check_common()
        if not self.messages:
            raise bad_request("messages must hold at least one message", "messages")
        for i, message in enumerate(self.messages):
            message.check_unknown_fields(f"messages[{i}].", "messages[].")
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= 20:
            raise bad_request(f"top_logprobs must be in [0, 20], got {self.top_logprobs}", "top_logprobs")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
