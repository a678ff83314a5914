"""OpenAI completions and chat completions on top of the engine core client.

A request is checked in full before anything is queued (types by pydantic, values by
SamplingParams, the prompt by `engine.validate_request`), so a client mistake is a
4xx that never reaches the engine thread. Streams are server-sent events; text deltas
hold back (a) a trailing U+FFFD, the byte-level tokenizer's partial UTF-8 character,
until the next token completes it, and (b) the last len(longest stop string) - 1
characters, which a stop string matched later would cut away.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..request.outputs import CompletionOutput, RequestOutput
from ..request.sampling_params import SamplingParams
from ..request.slo import CLASS_NAME, RequestSlo, SloClass, SloClasses, best_effort_seats
from ..scheduling.ttft_predictor import TtftPredictor
from ..structured_outputs.limits import StructuredOutputsLimits
from ..structured_outputs.params import StructuredOutputsParams
from ..structured_outputs.request import check_constraint
from .admission import Admission, AdmissionConfig
from .api_models import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields
from .chat import ChatTemplateError, render_chat, template_messages
from .core_client import EngineCoreClient, EngineUnavailable, RequestFailed, RequestRejected
from .errors import ApiError, bad_request, error_body
from .logprobs import (
    chat_logprobs,
    completion_logprobs,
    echo_logprobs,
    end_offset,
    join_completion_logprobs,
    prompt_logprobs_json,
)
from .streaming import SSE_DONE, ClientDisconnected, SSEResponse, sse, until_disconnected
from .tool_parsers import TOOL_PARSERS, ToolCallStream, ToolParser, detect_tool_parser, make_tool_parser
from .tool_parsers.forced_json import forced_json_parser
from .tool_parsers.tool_choice import ToolRequest, check_forced_schemas, forced_call_constraint, tool_request
from .tracing import TRACE_HEADERS

REPLACEMENT_CHAR = "\ufffd"
# Sequences one request may start (prompts x n): one request must not fill the scheduler
# (a 4 KB batch of 100 prompts with n=128 is 12,800 sequences).
MAX_SEQUENCES_PER_REQUEST = 256
# Text prompts at least this long are tokenized in a worker thread, so that a megabyte
# prompt (about a second of tokenizing) does not hold up every other request's event loop.
TOKENIZE_IN_THREAD_CHARS = 16384
SLO_CLASS_HEADER = "x-slo-class"


@dataclass(slots=True)
class _Prompt:
    text: str | list[int]
    token_ids: list[int]


@dataclass(slots=True)
class _ChoiceState:
    sent_chars: int = 0
    sent_tokens: int = 0
    started: bool = False
    done: bool = False
    tool_stream: ToolCallStream | None = None


@dataclass(slots=True)
class _Job:
    """One API request: its prompts (a batch for completions), params and ids."""

    request_id: str
    created: int
    model: str
    prompts: list[_Prompt]
    params: SamplingParams
    priority: int
    slo_class: SloClass
    stream: bool
    include_usage: bool
    continuous_usage: bool
    chat: bool
    top_logprobs: int | None = None
    trace_headers: dict[str, str] | None = None
    states: dict[tuple[int, int], _ChoiceState] = field(default_factory=dict)
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


def streamable_text(text: str, finished: bool, holdback: int) -> str:
    """The part of a cumulative text that is safe to send now."""
    if finished:
        return text
    end = len(text) - holdback
    while end > 0 and text[end - 1] == REPLACEMENT_CHAR:
        end -= 1
    return text[: max(end, 0)]


class OpenAIServing:
    def __init__(
        self,
        engine: EngineCoreClient,
        served_model_name: str,
        tool_call_parser: str | None = None,
        slo_classes: SloClasses | None = None,
        admission: AdmissionConfig | None = None,
    ):
        self.engine = engine
        self.slo_classes = slo_classes if slo_classes is not None else SloClasses()
        predictor = getattr(engine, "ttft_predictor", None)
        self.admission = Admission(admission or AdmissionConfig(), predictor or TtftPredictor())
        self.model_name = served_model_name
        self.tokenizer = engine.tokenizer
        if tool_call_parser is not None and tool_call_parser not in TOOL_PARSERS:
            raise ValueError(
                f"tool_call_parser must be one of {', '.join(sorted(TOOL_PARSERS))}; got {tool_call_parser!r}"
            )
        self.tool_call_parser_option = tool_call_parser

    @property
    def tool_call_parser(self) -> str | None:
        # Without the option, the chat template says which format its model calls tools in.
        return self.tool_call_parser_option or detect_tool_parser(self.tokenizer.chat_template)

    @property
    def structured_limits(self) -> StructuredOutputsLimits:
        config = getattr(self.engine, "config", None)
        return StructuredOutputsLimits.from_config(config) if config is not None else StructuredOutputsLimits()

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len  # set from the engine core's limits once it is ready

    @property
    def chat_adds_special_tokens(self) -> bool:
        # A template writes its own special tokens; the plain default relies on the tokenizer's.
        return self.tokenizer.chat_template is None

    # --- prompts ----------------------------------------------------------------------
    def chat_prompt(self, messages: list[ChatMessage], add_generation_prompt: bool, tools: ToolRequest | None) -> str:
        """The messages as prompt text, through the model's chat template (chat.py); a 400
        naming messages when the template refuses them."""
        tok = self.tokenizer
        rendered = template_messages(messages, short_ids=self.tool_call_parser == "mistral")
        try:
            return render_chat(
                rendered,
                tok.chat_template,
                tok.bos_token,
                tok.eos_token,
                add_generation_prompt,
                tools=tools.tools if tools else None,
            )
        except ChatTemplateError as exc:
            raise bad_request(str(exc), "messages") from None

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """The token ids of `text`; a long one in a worker thread, so the event loop stays free."""
        tok = self.tokenizer
        if len(text) >= TOKENIZE_IN_THREAD_CHARS:
            return await asyncio.to_thread(tok.encode, text, add_special_tokens=add_special_tokens)
        return tok.encode(text, add_special_tokens=add_special_tokens)

    # --- checks ---------------------------------------------------------------------
    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise ApiError(404, f"The model `{name}` does not exist.", "model", "model_not_found")

    async def _validate_prompt(self, prompt: str | list[int], params: SamplingParams, param: str) -> list[int]:
        try:
            if isinstance(prompt, str) and len(prompt) >= TOKENIZE_IN_THREAD_CHARS:
                return await asyncio.to_thread(self.engine.validate_request, prompt, params)
            return self.engine.validate_request(prompt, params)
        except ValueError as exc:
            code = "context_length_exceeded" if "max_model_len" in str(exc) or "KV" in str(exc) else "invalid_value"
            named = str(exc).partition(" ")[0]
            if named in ("stop_token_ids", "logit_bias"):  # token ids checked against the vocabulary
                param = named
            raise bad_request(str(exc), param, code) from None

    def slo_class(self, body: SamplingFields, request: Request) -> SloClass:
        """The request's SLO class: the body's `slo_class`, else the X-SLO-Class header, else
        the default class; a 400 naming the field (or header) for one not configured."""
        name, param = body.slo_class, "slo_class"
        if name is None and SLO_CLASS_HEADER in request.headers:
            name, param = request.headers[SLO_CLASS_HEADER].strip(), "X-SLO-Class"
            if not CLASS_NAME.match(name):
                raise bad_request(
                    f"X-SLO-Class must be a class name (letters, digits, '_', '.', '-'; at most 64), got {name!r}",
                    param,
                )
        try:
            return self.slo_classes.get(name)
        except KeyError:
            known = ", ".join(self.slo_classes.names)
            raise bad_request(f"{param}: unknown SLO class {name!r}; this server has: {known}", param) from None

    @staticmethod
    def _check_sequences(num_prompts: int, n: int | None) -> None:
        if num_prompts * (n or 1) > MAX_SEQUENCES_PER_REQUEST:
            raise bad_request(
                f"this request would start {num_prompts * (n or 1)} sequences ({num_prompts} prompt(s) x "
                f"n={n}); at most {MAX_SEQUENCES_PER_REQUEST} are allowed per request",
                "n",
            )

    def _check_length(self, num_prompt: int, max_tokens: int, param: str) -> None:
        if num_prompt + max_tokens > self.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{num_prompt + max_tokens} tokens ({num_prompt} in the prompt, {max_tokens} in the completion). "
                f"Please reduce the prompt or the completion length.",
                param,
                "context_length_exceeded",
            )

    def _params(
        self,
        body: SamplingFields,
        max_tokens: int,
        logprobs: int | None,
        param: str,
        prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        if isinstance(max_tokens, int) and max_tokens < 1:
            raise bad_request(f"{param} must be an integer >= 1, got {max_tokens}", param)
        return body.sampling_params(max_tokens, logprobs, prompt_logprobs, self.structured_limits)

    def _job(
        self,
        body: SamplingFields,
        slo_class: SloClass,
        prompts: list[_Prompt],
        params: SamplingParams,
        chat: bool,
        top_logprobs: int | None = None,
    ) -> _Job:
        prefix = "chatcmpl" if chat else "cmpl"
        # vLLM's priority field wins; a class's priority stands in for a request that sends none.
        priority = body.priority
        if "priority" not in body.model_fields_set and slo_class.priority is not None:
            priority = slo_class.priority
        job = _Job(
            f"{prefix}-{uuid.uuid4().hex}",
            int(time.time()),
            self.model_name,
            prompts,
            params,
            priority,
            slo_class,
            bool(body.stream),
            body.include_usage,
            bool(body.stream_options and body.stream_options.continuous_usage_stats),
            chat,
            top_logprobs,
        )
        job.prompt_logprobs = body.prompt_logprobs
        return job

    # --- endpoints ----------------------------------------------------------------------
    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        body.check()
        self.check_model(body.model)
        slo_class = self.slo_class(body, request)
        raw_prompts = body.prompts()
        self._check_sequences(len(raw_prompts), body.n)
        # Without max_tokens the prompt decides it; check the other values against the longest possible.
        # Echo without a completion still runs the engine's one step that scores the prompt;
        # the token it samples is dropped (_Job.echo_only).
        requested = 1 if body.echo_only else body.max_tokens
        prompt_lps = body.num_prompt_logprobs
        probe = self._params(
            body,
            requested if requested is not None else self.max_model_len,
            body.logprobs,
            "max_tokens",
            prompt_lps,
        )
        prompts = []
        for i, p in enumerate(raw_prompts):
            if isinstance(p, list) and not p:
                raise bad_request(f"prompt[{i}] is empty", "prompt")
            ids = await self._validate_prompt(p, probe, "prompt")
            prompts.append(_Prompt(p, ids))
        if body.max_tokens is None:
            max_tokens = self.max_model_len - max(len(p.token_ids) for p in prompts)
            params = self._params(body, max_tokens, body.logprobs, "max_tokens", prompt_lps)
        else:
            params = probe
        for prompt in prompts:
            self._check_length(len(prompt.token_ids), params.max_tokens, "max_tokens")
        job = self._job(body, slo_class, prompts, params, chat=False)
        job.echo, job.echo_only = bool(body.echo), body.echo_only
        return await self._respond(job, request)

    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Response:
        body.check()
        self.check_model(body.model)
        slo_class = self.slo_class(body, request)
        self._check_sequences(1, body.n)
        for i, m in enumerate(body.messages):
            m.check_role(i)
        tools = tool_request(body.tools, body.tool_choice, body.parallel_tool_calls)
        parser = self._tool_parser(tools)
        text = self.chat_prompt(body.messages, body.add_generation_prompt, tools)
        ids = await self.encode(text, self.chat_adds_special_tokens)
        if not ids:
            raise bad_request("messages render to an empty prompt", "messages")
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        requested = body.requested_max_tokens
        probe = self._params(
            body,
            requested if requested is not None else self.max_model_len,
            body.num_logprobs,
            param,
            body.prompt_logprobs,
        )
        await self._validate_prompt(ids, probe, "messages")
        if requested is None:
            params = self._params(body, self.max_model_len - len(ids), body.num_logprobs, param, body.prompt_logprobs)
        else:
            params = probe
        self._check_length(len(ids), params.max_tokens, param)
        if parser is not None and tools is not None:
            params = self._tool_params(params, tools, parser, self.structured_limits)
        job = self._job(body, slo_class, [_Prompt(ids, ids)], params, chat=True, top_logprobs=body.top_logprobs)
        job.tools, job.tool_parser = tools, parser
        return await self._respond(job, request)

    # --- tools --------------------------------------------------------------------------
    def _tool_parser(self, tools: ToolRequest | None) -> ToolParser | None:
        if tools is None or not tools.parses_calls:
            return None
        if self.tool_call_parser is not None:
            return make_tool_parser(self.tool_call_parser, self.tokenizer.eos_token)
        if tools.is_forced:  # vLLM's JSON, generated under structured outputs: any template will do
            return forced_json_parser(tools.choice, tools.named)
        raise bad_request(
            'tool_choice "auto" needs a tool call format: this model\'s chat template names none; '
            f"start the server with --tool-call-parser ({', '.join(sorted(TOOL_PARSERS))}), "
            'or send tool_choice "none", "required" or a named function',
            "tool_choice",
        )

    @staticmethod
    def _tool_params(
        params: SamplingParams, tools: ToolRequest, parser: ToolParser, limits: StructuredOutputsLimits
    ) -> SamplingParams:
        changes: dict[str, Any] = {}
        if parser.keeps_special_tokens:
            changes["skip_special_tokens"] = False  # the format's marker is a special token
        if tools.is_forced:
            if params.structured_outputs is not None:
                raise bad_request(
                    "a forced tool call (tool_choice required or a named function) cannot be combined with "
                    "response_format or another structured output",
                    "tool_choice",
                )
            check_forced_schemas(tools, limits)
            constraint = StructuredOutputsParams(**forced_call_constraint(parser, tools))
            try:
                check_constraint(constraint, limits)
            except ValueError as exc:  # each schema compiles, but not all of them as one call
                message = str(exc).removeprefix("structured_outputs.json").lstrip(": ")
                raise bad_request(f"tools cannot constrain a forced call: {message}", "tools") from None
            changes["structured_outputs"] = constraint
        return dataclasses.replace(params, **changes) if changes else params

    def _chat_message(self, job: _Job, o: CompletionOutput) -> tuple[dict[str, Any], str | None]:
        """A choice's message and finish reason, with the tool calls parsed out of its text."""
        if job.tool_parser is None or job.tools is None:
            return {"role": "assistant", "content": o.text}, o.finish_reason
        found = job.tool_parser.extract(o.text, job.tools.names)
        if not found.tool_calls:
            return {"role": "assistant", "content": found.content}, o.finish_reason
        calls = found.tool_calls if job.tools.parallel else found.tool_calls[:1]
        message = {"role": "assistant", "content": found.content, "tool_calls": [c.to_openai() for c in calls]}
        return message, "tool_calls"

    async def _respond(self, job: _Job, request: Request) -> Response:
        request.state.request_id = job.request_id  # X-Request-Id, unless the client sent its own (middleware.py)
        job.trace_headers = {k: request.headers[k] for k in TRACE_HEADERS if k in request.headers} or None
        if self.slo_classes.is_configured:  # else nothing differs from a server without classes
            job.slo = self.slo_classes.request_slo(job.slo_class, time.time())
        # Before the response starts: a refusal is a 429/503 status, never a cut stream.
        deadline = job.slo.deadline if job.slo is not None else None
        decision = self.admission.check(
            job.slo_class, job.priority, deadline, job.num_prompt_tokens, job.num_seqs, self._deadline_seats()
        )
        job.predicted_ttft_s = decision.predicted_ttft_s
        if decision.demoted and job.slo is not None:
            job.slo = RequestSlo(job.slo.class_name, None, job.slo.tpot_s, None)
        if job.stream:
            return SSEResponse(self._stream(job))
        try:
            finals = await until_disconnected(request, self._collect(job))
        except ClientDisconnected:
            return Response(status_code=499)
        return JSONResponse(self._final_body(job, finals))

    def _deadline_seats(self) -> int | None:
        """Seats deadline sequences may hold now: max_num_seqs (as tuned) less best effort's."""
        config = getattr(self.engine, "config", None)
        if config is None:
            return None
        seats = self.engine.snapshot().tunables.get("max_num_seqs", config.max_num_seqs)
        return seats - best_effort_seats(seats, config.best_effort_seat_share)

    # --- running ------------------------------------------------------------------------
    async def _outputs(self, job: _Job) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        """(prompt index, cumulative output) from all of the job's prompts, as they come; the
        job counts in admission's queue until its first output."""
        deadline = job.slo.deadline if job.slo is not None else None
        ticket = self.admission.enter(job.priority, deadline, job.num_prompt_tokens, job.num_seqs)
        outputs = self._engine_outputs(job, lambda: self.admission.started(ticket))
        try:
            async for item in outputs:
                self.admission.started(ticket)
                yield item
        finally:
            self.admission.leave(ticket)
            await outputs.aclose()

    async def _engine_outputs(
        self, job: _Job, on_first_token: Callable[[], None]
    ) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        if len(job.prompts) == 1:
            p = job.prompts[0]
            gen = self.engine.generate(
                job.request_id,
                p.text,
                p.token_ids,
                job.params,
                job.priority,
                job.trace_headers,
                final_only=not job.stream,
                slo=job.slo,
                predicted_ttft_s=job.predicted_ttft_s,
                on_first_token=on_first_token,
            )
            try:
                async for out in gen:
                    yield 0, out
            finally:
                await gen.aclose()
            return
        merged: asyncio.Queue = asyncio.Queue()
        remaining = len(job.prompts)

        async def pump(i: int, p: _Prompt) -> None:
            gen = self.engine.generate(
                f"{job.request_id}-{i}",
                p.text,
                p.token_ids,
                job.params,
                job.priority,
                job.trace_headers,
                final_only=not job.stream,
                slo=job.slo,
                predicted_ttft_s=job.predicted_ttft_s,
                on_first_token=on_first_token,
            )
            try:
                async for out in gen:
                    await merged.put((i, out))
            except Exception as exc:
                await merged.put((i, exc))
            finally:
                await gen.aclose()
                await merged.put((i, None))

        tasks = [asyncio.ensure_future(pump(i, p)) for i, p in enumerate(job.prompts)]
        try:
            while remaining:
                i, item = await merged.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _collect(self, job: _Job) -> list[RequestOutput]:
        finals: dict[int, RequestOutput] = {}
        async for i, out in self._outputs(job):
            finals[i] = out
        return [finals[i] for i in range(len(job.prompts))]

    # --- responses ----------------------------------------------------------------------
    def _usage(self, job: _Job, outs: Sequence[RequestOutput | None]) -> dict[str, Any]:
        prompt = sum(len(p.token_ids) for p in job.prompts)
        completion = 0
        if not job.echo_only:
            completion = sum(len(o.token_ids) for out in outs if out is not None for o in out.outputs)
        # Prompt tokens the prefix cache supplied (OpenAI's field; vLLM's with --enable-prompt-tokens-details).
        cached = sum(out.num_cached_tokens for out in outs if out is not None)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def _final_body(self, job: _Job, finals: list[RequestOutput]) -> dict:
        n = job.params.n
        choices = []
        for i, out in enumerate(finals):
            for o in out.outputs:
                index = i * n + o.index
                if job.chat:
                    message, finish_reason = self._chat_message(job, o)
                    choices.append(
                        {
                            "index": index,
                            "message": message,
                            "logprobs": chat_logprobs(self.tokenizer, o, job.top_logprobs or 0, 0)
                            if job.params.logprobs is not None
                            else None,
                            "finish_reason": finish_reason,
                            "stop_reason": o.stop_reason,
                        }
                    )
                else:
                    choice = {
                        "index": index,
                        "text": self._echo_text(job, i) + ("" if job.echo_only else o.text),
                        "logprobs": self._completion_logprobs(job, i, out, o, 0, True)
                        if job.params.logprobs is not None
                        else None,
                        "finish_reason": "length" if job.echo_only else o.finish_reason,
                        "stop_reason": None if job.echo_only else o.stop_reason,
                    }
                    if job.prompt_logprobs is not None:
                        choice["prompt_logprobs"] = self._prompt_logprobs(job, i, out)
                    choices.append(choice)
        body: dict[str, Any] = {
            "id": job.request_id,
            "object": "chat.completion" if job.chat else "text_completion",
            "created": job.created,
            "model": job.model,
            "choices": choices,
            "usage": self._usage(job, finals),
        }
        if job.chat and job.prompt_logprobs is not None:
            body["prompt_logprobs"] = self._prompt_logprobs(job, 0, finals[0])
        return body

    # --- echo and prompt logprobs -------------------------------------------------------
    def _echo_text(self, job: _Job, i: int) -> str:
        if not job.echo:
            return ""
        text = job.prompts[i].text
        return text if isinstance(text, str) else self.tokenizer.decode(text, skip_special_tokens=False)

    def _prompt_logprobs(self, job: _Job, i: int, out: RequestOutput) -> list | None:
        if out.prompt_logprobs is None or job.prompt_logprobs is None:
            return None
        return prompt_logprobs_json(job.prompts[i].token_ids, out.prompt_logprobs, job.prompt_logprobs)

    def _completion_logprobs(
        self, job: _Job, i: int, out: RequestOutput | None, o: CompletionOutput, start: int, with_prompt: bool
    ) -> dict:
        """A completion choice's logprobs from token `start`; with echo and `with_prompt`,
        the prompt's first (vLLM: prompt tokens, then the completion's)."""
        if not (job.echo and with_prompt):
            if job.echo_only:
                return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
            return completion_logprobs(self.tokenizer, o, start)
        prompt_ids = job.prompts[i].token_ids
        lps = (out.prompt_logprobs if out is not None else None) or [None] * len(prompt_ids)
        head = echo_logprobs(self.tokenizer, prompt_ids, lps, job.params.logprobs or 0)
        if job.echo_only:
            return head
        return join_completion_logprobs(head, completion_logprobs(self.tokenizer, o, start, end_offset(head)))

    # --- streaming ----------------------------------------------------------------------
    async def _stream(self, job: _Job) -> AsyncGenerator[str, None]:
        n = job.params.n
        holdback = max((len(s) for s in job.params.stop), default=1) - 1
        latest: list[RequestOutput | None] = [None] * len(job.prompts)
        base: dict[str, Any] = {
            "id": job.request_id,
            "object": "chat.completion.chunk" if job.chat else "text_completion",
            "created": job.created,
            "model": job.model,
        }
        outputs = self._outputs(job)
        prompt_logprobs_sent = False
        try:
            if job.chat:
                # The role comes first, as OpenAI sends it.
                yield sse(
                    base
                    | {
                        "choices": [
                            {
                                "index": i * n + j,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                            for i in range(len(job.prompts))
                            for j in range(n)
                        ]
                    }
                )
            async for i, out in outputs:
                latest[i] = out
                choices = []
                for o in out.outputs:
                    state = job.states.setdefault((i, o.index), _ChoiceState())
                    if state.done:
                        continue
                    choice = self._delta(job, i * n + o.index, o, state, holdback, out, i)
                    if choice is not None:
                        choices.append(choice)
                if choices:
                    chunk = base | {"choices": choices}
                    if job.chat and job.prompt_logprobs is not None and not prompt_logprobs_sent:
                        chunk["prompt_logprobs"] = self._prompt_logprobs(job, 0, out)  # chat: top level, once
                        prompt_logprobs_sent = True
                    if job.include_usage and job.continuous_usage:
                        chunk["usage"] = self._usage(job, latest)
                    yield sse(chunk)
            if job.include_usage:
                yield sse(base | {"choices": [], "usage": self._usage(job, latest)})
        except RequestFailed as exc:
            yield sse(error_body(500, str(exc), None, "engine_error"))
        except RequestRejected as exc:  # e.g. a grammar that did not compile in time
            yield sse(error_body(400, str(exc), None, "invalid_value"))
        except EngineUnavailable as exc:
            yield sse(error_body(503, str(exc), None, exc.reason))
        finally:
            await outputs.aclose()
        yield SSE_DONE

    def _delta(
        self,
        job: _Job,
        index: int,
        o: CompletionOutput,
        state: _ChoiceState,
        holdback: int,
        out: RequestOutput | None = None,
        prompt_index: int = 0,
    ) -> dict | None:
        finished = o.finish_reason is not None
        text = streamable_text(o.text, finished, holdback)
        delta_text = text[state.sent_chars :] if len(text) > state.sent_chars else ""
        new_tokens = len(o.token_ids) - state.sent_tokens
        if job.tool_parser is not None and job.tools is not None:
            return self._tool_delta(job, index, o, state, text, new_tokens)
        if job.echo_only:
            delta_text, new_tokens = "", 0
        echo_now = job.echo and not state.started  # the prompt goes out with the choice's first chunk
        # so do its prompt logprobs (completions: in the choice, as in the whole response)
        prompt_lps_now = not job.chat and job.prompt_logprobs is not None and not state.started
        if (
            not echo_now
            and not prompt_lps_now
            and not delta_text
            and not finished
            and not (job.params.logprobs is not None and new_tokens > 0)
        ):
            return None
        logprobs = None
        if job.params.logprobs is not None:
            logprobs = (
                chat_logprobs(self.tokenizer, o, job.top_logprobs or 0, state.sent_tokens)
                if job.chat
                else self._completion_logprobs(job, prompt_index, out, o, state.sent_tokens, echo_now)
            )
        if echo_now:
            delta_text = self._echo_text(job, prompt_index) + delta_text
        state.started = True
        state.sent_chars = max(state.sent_chars, len(text))
        state.sent_tokens = len(o.token_ids)
        state.done = finished
        if job.chat:
            delta = {"content": delta_text} if delta_text or not finished else {}
            return {
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": o.finish_reason,
                "stop_reason": o.stop_reason,
            }
        choice = {
            "index": index,
            "text": delta_text,
            "logprobs": logprobs,
            "finish_reason": ("length" if job.echo_only and finished else o.finish_reason),
            "stop_reason": None if job.echo_only else o.stop_reason,
        }
        if prompt_lps_now:
            choice["prompt_logprobs"] = self._prompt_logprobs(job, prompt_index, out) if out is not None else None
        return choice

    def _tool_delta(
        self, job: _Job, index: int, o: CompletionOutput, state: _ChoiceState, text: str, new_tokens: int
    ) -> dict | None:
        assert job.tool_parser is not None and job.tools is not None
        finished = o.finish_reason is not None
        if state.tool_stream is None:
            state.tool_stream = ToolCallStream(job.tool_parser, job.tools.names, 0 if job.tools.parallel else 1)
        update = state.tool_stream.update(text, finished)
        delta: dict[str, Any] = {}
        if update.content:
            delta["content"] = update.content
        if update.tool_calls:
            delta["tool_calls"] = update.tool_calls
        if not delta and not finished and not (job.params.logprobs is not None and new_tokens > 0):
            return None
        logprobs = None
        if job.params.logprobs is not None:
            logprobs = chat_logprobs(self.tokenizer, o, job.top_logprobs or 0, state.sent_tokens)
        state.sent_chars = max(state.sent_chars, len(text))
        state.sent_tokens = len(o.token_ids)
        state.done = finished
        return {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": "tool_calls" if finished and update.is_tool_call else o.finish_reason,
            "stop_reason": o.stop_reason,
        }

    # --- models -------------------------------------------------------------------------
    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "inferd",
                    "root": self.engine.model_name,
                    "parent": None,
                    "max_model_len": self.max_model_len,
                }
            ],
        }
