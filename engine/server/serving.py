"""OpenAI completions and chat completions on top of the engine core client.

A request is checked in full before anything is queued (types by pydantic, values by
SamplingParams, the prompt by `engine.validate_request`), so a client mistake is a
4xx that never reaches the engine thread. `OpenAIServing` turns the request into a `Job`
(job.py), admits it and answers with the whole body (response_bodies.py) or a stream of
server-sent events (stream_chunks.py); job_outputs.py runs it in the engine. Chat
prompts are rendered and encoded by prompt_encoding.py, tool calls handled by
chat_tools.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..request.sampling_params import SamplingParams
from ..request.slo import CLASS_NAME, RequestSlo, SloClass, SloClasses, best_effort_seats
from ..scheduling.ttft_predictor import TtftPredictor
from ..structured_outputs.limits import StructuredOutputsLimits
from .admission import Admission, AdmissionConfig
from .api_models import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields
from .chat_tools import tool_params, tool_parser_for
from .core_client import EngineCoreClient
from .errors import ApiError, bad_request
from .job import Job, Prompt
from .job_outputs import final_outputs, job_outputs
from .prompt_encoding import TOKENIZE_IN_THREAD_CHARS, encode_text, render_chat_prompt
from .response_bodies import final_body
from .stream_chunks import stream_chunks
from .streaming import ClientDisconnected, SSEResponse, until_disconnected
from .tool_parsers import TOOL_PARSERS, ToolParser, detect_tool_parser
from .tool_parsers.tool_choice import ToolRequest, tool_request
from .tracing import TRACE_HEADERS

# Sequences one request may start (prompts x n): one request must not fill the scheduler
# (a 4 KB batch of 100 prompts with n=128 is 12,800 sequences).
MAX_SEQUENCES_PER_REQUEST = 256
SLO_CLASS_HEADER = "x-slo-class"


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
        """The messages as prompt text, through the model's chat template (prompt_encoding.py)."""
        short_ids = self.tool_call_parser == "mistral"
        return render_chat_prompt(self.tokenizer, messages, add_generation_prompt, tools, short_ids)

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """The token ids of `text`; a long one in a worker thread, so the event loop stays free."""
        return await encode_text(self.tokenizer, text, add_special_tokens)

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
        prompts: list[Prompt],
        params: SamplingParams,
        chat: bool,
        top_logprobs: int | None = None,
    ) -> Job:
        prefix = "chatcmpl" if chat else "cmpl"
        # vLLM's priority field wins; a class's priority stands in for a request that sends none.
        priority = body.priority
        if "priority" not in body.model_fields_set and slo_class.priority is not None:
            priority = slo_class.priority
        job = Job(
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
        # the token it samples is dropped (Job.echo_only).
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
            prompts.append(Prompt(p, ids))
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
            params = tool_params(params, tools, parser, self.structured_limits)
        job = self._job(body, slo_class, [Prompt(ids, ids)], params, chat=True, top_logprobs=body.top_logprobs)
        job.tools, job.tool_parser = tools, parser
        return await self._respond(job, request)

    # --- tools --------------------------------------------------------------------------
    def _tool_parser(self, tools: ToolRequest | None) -> ToolParser | None:
        return tool_parser_for(tools, self.tool_call_parser, self.tokenizer.eos_token)

    # --- admission and the answer -------------------------------------------------------
    async def _respond(self, job: Job, request: Request) -> Response:
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
            return SSEResponse(stream_chunks(self.tokenizer, job, job_outputs(self.engine, self.admission, job)))
        try:
            finals = await until_disconnected(request, final_outputs(self.engine, self.admission, job))
        except ClientDisconnected:
            return Response(status_code=499)
        return JSONResponse(final_body(self.tokenizer, job, finals))

    def _deadline_seats(self) -> int | None:
        """Seats deadline sequences may hold now: max_num_seqs (as tuned) less best effort's."""
        config = getattr(self.engine, "config", None)
        if config is None:
            return None
        seats = self.engine.snapshot().tunables.get("max_num_seqs", config.max_num_seqs)
        return seats - best_effort_seats(seats, config.best_effort_seat_share)

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
