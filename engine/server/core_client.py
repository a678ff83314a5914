"""The API server's side of the engine core: starts the core process and talks to it.

`EngineCoreClient` lives on the server's event loop. It sends adds, aborts and utility
calls (engine/server/core_messages.py) without ever blocking, and one reader task
applies what the core sends: each step's deltas are folded into the live requests'
cumulative outputs and wake their consumers (a consumer that fell behind sees only
the newest state), step statistics feed the metrics, snapshots replace the one
/metrics reads. The tokenizer lives here too, so prompts are checked and tokenized
before the core sees them.

States: `loading` until the core reports ready; `ready`; `engine_stalled` while the
core has said nothing for longer than `stall_timeout_s` (a step, an idle heartbeat:
a live core always speaks within its heartbeat); `engine_dead` once the process has
exited or reported failure, after which every call raises `EngineUnavailable`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import shutil
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from ..config import EngineConfig, TunableError
from ..model.model_config import ModelConfig
from ..request.outputs import CompletionOutput, RequestOutput
from ..request.prompt_logprobs import PromptLogprobs
from ..request.request_validator import RequestValidator
from ..request.sampling_params import SamplingParams
from ..request.slo import DEFAULT_CLASS, RequestSlo
from ..scheduling.ttft_predictor import TtftPredictor
from ..text.tokenizer import Tokenizer
from .core_dirs import make_core_dir, remove_stale_core_dirs
from .core_messages import (
    AbortRequests,
    AddRequest,
    CoreFailed,
    CoreReady,
    Heartbeat,
    RequestDelta,
    Shutdown,
    StepOutputs,
    UtilityCall,
    UtilityResult,
    encoder,
    from_core_decoder,
)
from .engine_core import CoreOptions, run_engine_core
from .snapshot import EngineSnapshot, empty_snapshot

if TYPE_CHECKING:
    from .metrics import StatLogger
    from .slo_metrics import SloLogger

log = logging.getLogger(__name__)

LOADING, READY, STALLED, DEAD = "loading", "ready", "engine_stalled", "engine_dead"


class EngineUnavailable(RuntimeError):
    """The engine cannot take this call now: `reason` is loading, engine_stalled,
    engine_dead or draining (a 503)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class RequestFailed(RuntimeError):
    """The engine raised while serving this request (a server fault, not a client one)."""


class RequestRejected(ValueError):
    """The engine refused to add this request (a client fault)."""


@dataclass(slots=True)
class _SeqState:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass(slots=True)
class _Live:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[_SeqState]
    wake_on_finish_only: bool = False  # a non-streaming consumer needs only the final output
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False
    num_cached_tokens: int = 0
    prompt_logprobs: PromptLogprobs | None = None
    error: BaseException | None = None
    slo_class: str = DEFAULT_CLASS
    predicted_ttft_s: float | None = None  # admission's prediction, judged when it finishes
    on_first_token: Callable[[], None] | None = None  # called once, streamed or not

    def apply(self, delta: RequestDelta) -> None:
        for d in delta.seqs:
            s = self.seqs[d.index]
            s.token_ids.extend(d.new_token_ids)
            if d.new_logprobs is not None:
                if s.logprobs is None:
                    s.logprobs = []
                s.logprobs.extend(d.new_logprobs)
            s.text = s.text[: d.text_keep] + d.text_add
            s.finish_reason, s.stop_reason = d.finish_reason, d.stop_reason
        self.finished = delta.finished
        self.num_cached_tokens = delta.num_cached_tokens
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        if self.finished or not self.wake_on_finish_only:
            self.changed.set()

    def output(self) -> RequestOutput:
        # The lists keep growing as deltas arrive: each output takes its length now and
        # copies that prefix only when read (see CompletionOutput).
        outs = [
            CompletionOutput(
                i,
                s.text,
                s.token_ids,
                s.logprobs if self.params.logprobs is not None else None,
                s.finish_reason,
                s.stop_reason,
                None if self.finished else len(s.token_ids),
            )
            for i, s in enumerate(self.seqs)
        ]
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            outs,
            self.finished,
            self.num_cached_tokens,
            self.prompt_logprobs,
        )

    def finish_as_aborted(self) -> None:
        for s in self.seqs:
            if s.finish_reason is None:
                s.finish_reason = "abort"
        self.finished = True
        self.changed.set()


class EngineCoreClient:
    def __init__(
        self,
        config: EngineConfig,
        *,
        otlp_endpoint: str | None = None,
        stall_timeout_s: float = 10.0,
        heartbeat_s: float = 1.0,
        engine_factory: Callable[[EngineConfig], Any] | None = None,
        on_dead: Callable[[str], None] | None = None,
        log_level: str = "INFO",
        torch_num_threads: int | None = None,
    ):
        if not stall_timeout_s > heartbeat_s:
            raise ValueError(f"stall_timeout_s ({stall_timeout_s}) must exceed heartbeat_s ({heartbeat_s})")
        self.config = config
        self.model_config = ModelConfig.from_dir(config.model)
        self.tokenizer = Tokenizer(config.model, list(self.model_config.eos_token_ids))
        self.max_model_len = config.max_model_len or self.model_config.max_position_embeddings
        self.fast_path_unavailable: str | None = None  # from the core once it is ready
        self.model_name = config.model
        self.stall_timeout_s = stall_timeout_s
        self.on_dead = on_dead
        self.stat_logger: StatLogger | None = None  # set by the app
        self.slo_logger: SloLogger | None = None  # set by the app
        self.ttft_predictor = TtftPredictor()  # the core's measured step rates, for admission
        self._otlp_endpoint = otlp_endpoint
        self._heartbeat_s = heartbeat_s
        self._engine_factory = engine_factory
        self._log_level = log_level
        self._torch_num_threads = torch_num_threads
        self._validator: RequestValidator | None = None
        self._state = LOADING
        self._dead_reason: str | None = None
        self._last_heard = time.monotonic()
        self._snapshot = empty_snapshot(config)
        self._live: dict[str, _Live] = {}
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._ready = asyncio.Event()
        self._encoder = encoder()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._dir: str | None = None
        self._reader: asyncio.Task | None = None
        self._stopping = False
        self.core_pid: int | None = None

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the core process (it loads the model meanwhile); call on the event loop."""
        self._loop = asyncio.get_running_loop()
        remove_stale_core_dirs()
        self._dir = make_core_dir()
        to_core, from_core = f"ipc://{self._dir}/in", f"ipc://{self._dir}/out"
        self._sync_ctx = zmq.Context()
        self._to_core = self._sync_ctx.socket(zmq.PUSH)
        self._to_core.setsockopt(zmq.SNDHWM, 0)  # sending never blocks the event loop
        self._to_core.setsockopt(zmq.LINGER, 0)
        self._to_core.bind(to_core)
        self._async_ctx = zmq.asyncio.Context()
        self._from_core = self._async_ctx.socket(zmq.PULL)
        self._from_core.setsockopt(zmq.RCVHWM, 0)
        self._from_core.setsockopt(zmq.LINGER, 0)
        self._from_core.bind(from_core)
        options = CoreOptions(
            self.config,
            to_core,
            from_core,
            os.getpid(),
            self._otlp_endpoint,
            self._heartbeat_s,
            log_level=self._log_level,
            torch_num_threads=self._torch_num_threads,
            engine_factory=self._engine_factory,
        )
        # spawn, not fork: the server process has threads and an event loop, and CUDA
        # must be initialised in the core alone.
        ctx = multiprocessing.get_context("spawn")
        process = ctx.Process(target=run_engine_core, args=(options,), name="inferd-engine-core", daemon=False)
        self._process = process
        process.start()
        self.core_pid = process.pid
        self._loop.add_reader(process.sentinel, self._on_core_exit)
        self._last_heard = time.monotonic()
        self._reader = asyncio.ensure_future(self._read_forever())
        log.info("engine core process %d starting", process.pid)

    async def wait_ready(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._ready.wait(), timeout)
        if self._state == DEAD:
            raise EngineUnavailable(DEAD, self._dead_message())

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the core to exit between steps, wait for it, kill it if it does not."""
        self._stopping = True
        proc = self._process
        if proc is not None:
            self._loop.remove_reader(proc.sentinel)
            if proc.is_alive():
                self._send(Shutdown())
                deadline = time.monotonic() + timeout
                while proc.is_alive() and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                if proc.is_alive():
                    log.warning("engine core %d did not exit in %.0f s; killing it", proc.pid, timeout)
                    proc.kill()
                proc.join(5)
        if self._reader is not None:
            self._reader.cancel()
        self._die("the server is shutting down", notify=False)
        self._from_core.close()
        self._to_core.close()
        self._async_ctx.term()
        self._sync_ctx.term()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    # --- state -------------------------------------------------------------------------
    @property
    def state(self) -> str:
        if self._state == READY and time.monotonic() - self._last_heard > self.stall_timeout_s:
            return STALLED
        return self._state

    @property
    def is_alive(self) -> bool:
        return self._state != DEAD

    @property
    def num_live_requests(self) -> int:
        return len(self._live)

    def snapshot(self) -> EngineSnapshot:
        return self._snapshot

    def stalled_message(self) -> str:
        return f"the engine core has not been heard from for over {self.stall_timeout_s:g} s"

    def _dead_message(self) -> str:
        return f"the engine core is not running ({self._dead_reason})"

    def check_can_serve(self) -> None:
        state = self.state
        if state == DEAD:
            raise EngineUnavailable(DEAD, self._dead_message())
        if state == LOADING:
            raise EngineUnavailable(LOADING, "the engine is still loading the model")
        if state == STALLED:
            # A request admitted now would wait on a core that may never step again (the
            # supervisor restarts it); the client does better retrying elsewhere.
            raise EngineUnavailable(STALLED, self.stalled_message())

    # --- requests ------------------------------------------------------------------------
    def validate_request(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        self.check_can_serve()
        assert self._validator is not None
        return self._validator.validate(prompt, params)

    async def generate(
        self,
        request_id: str,
        prompt: str | list[int],
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        trace_headers: dict[str, str] | None = None,
        final_only: bool = False,
        slo: RequestSlo | None = None,
        predicted_ttft_s: float | None = None,
        on_first_token: Callable[[], None] | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Cumulative outputs of one request until it finishes (with `final_only`, just the
        last). `on_first_token` is called when the engine reports the first token, even when
        the outputs come only at the end. Leaving early (the client went away, the task was
        cancelled) aborts the request in the engine at once."""
        self.check_can_serve()
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already in use")
        live = _Live(
            request_id,
            prompt if isinstance(prompt, str) else None,
            prompt_token_ids,
            params,
            [_SeqState() for _ in range(params.n)],
            wake_on_finish_only=final_only,
            slo_class=slo.class_name if slo is not None else DEFAULT_CLASS,
            predicted_ttft_s=predicted_ttft_s,
            on_first_token=on_first_token,
        )
        self._live[request_id] = live
        finished = False
        try:
            self._send(
                AddRequest(
                    request_id,
                    live.prompt,
                    prompt_token_ids,
                    params,
                    priority,
                    time.time(),
                    trace_headers,
                    final_only,
                    slo,
                )
            )
            while True:
                await live.changed.wait()
                live.changed.clear()
                if live.error is not None:
                    finished = True  # the engine already dropped it
                    raise live.error
                out = live.output()
                finished = out.finished
                yield out
                if finished:
                    return
        finally:
            self._live.pop(request_id, None)
            if not finished and self._state != DEAD:
                self._send(AbortRequests([request_id]))

    def abort_all(self) -> int:
        """End every live request now as aborted (streams get their final chunk)."""
        ids = list(self._live)
        if ids and self._state != DEAD:
            self._send(AbortRequests(ids))
        for request_id in ids:
            self._live[request_id].finish_as_aborted()
        return len(ids)

    # --- utility calls -------------------------------------------------------------------
    async def _call(self, method: str, *args: Any) -> Any:
        self.check_can_serve()
        call_id = next(self._call_ids)
        future = self._loop.create_future()
        self._calls[call_id] = future
        try:
            self._send(UtilityCall(call_id, method, list(args)))
            return await future
        finally:
            self._calls.pop(call_id, None)

    async def get_tunables(self) -> dict[str, Any]:
        return await self._call("get_tunables")

    async def reconfigure(self, changes: dict[str, Any]) -> dict[str, Any]:
        return await self._call("reconfigure", changes)

    async def set_mode(self, mode: str) -> dict[str, Any]:
        return await self._call("set_mode", mode)

    async def inject_fastpath_failure(self, reason: str) -> None:
        await self._call("inject_fastpath_failure", reason)

    async def inject_slow_swap(self, seconds_per_block: float) -> None:
        await self._call("inject_slow_swap", seconds_per_block)

    # --- the channel ---------------------------------------------------------------------
    def _send(self, msg) -> None:
        self._to_core.send(self._encoder.encode(msg), zmq.NOBLOCK, copy=False)

    async def _read_forever(self) -> None:
        decoder = from_core_decoder()
        try:
            while True:
                frame = await self._from_core.recv(copy=False)
                self._last_heard = time.monotonic()
                self._dispatch(decoder.decode(frame.buffer))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug on this side: the channel cannot be trusted any more
            log.exception("engine core channel failed")
            self._die(f"channel failed: {type(exc).__name__}: {exc}")

    def _dispatch(self, msg) -> None:
        if isinstance(msg, StepOutputs):
            self._on_step(msg)
        elif isinstance(msg, Heartbeat):
            if msg.snapshot is not None:
                self._snapshot = msg.snapshot
        elif isinstance(msg, UtilityResult):
            self._on_result(msg)
        elif isinstance(msg, CoreReady):
            self._validator = RequestValidator(self.tokenizer, msg.limits)
            self.max_model_len = msg.limits.max_model_len  # the core may have clamped it to the KV pool
            self.fast_path_unavailable = msg.fast_path_unavailable
            self._snapshot = msg.snapshot
            self._state = READY
            self._ready.set()
            log.info("engine core %d ready: %s", msg.pid, msg.tunables)
        elif isinstance(msg, CoreFailed):
            self._die(msg.message)

    def _on_step(self, msg: StepOutputs) -> None:
        stats = self.stat_logger
        for delta in msg.outputs:
            live = self._live.get(delta.request_id)
            if live is None:
                continue
            live.apply(delta)
            if delta.finished and stats is not None:
                stats.record_request(live.params.n, live.params.max_tokens, max(len(s.token_ids) for s in live.seqs))
        for err in msg.errors:
            live = self._live.get(err.request_id)
            if live is not None:
                if err.unavailable_reason is not None:
                    live.error = EngineUnavailable(err.unavailable_reason, err.message)
                elif err.is_client_error:
                    live.error = RequestRejected(err.message)
                else:
                    live.error = RequestFailed(err.message)
                live.changed.set()
        if msg.snapshot is not None:
            self._snapshot = msg.snapshot
        if msg.stats is not None:
            for request_id in msg.stats.first_token_request_ids:
                live = self._live.get(request_id)
                if live is not None and live.on_first_token is not None:
                    live.on_first_token()
                    live.on_first_token = None
            self.ttft_predictor.observe(msg.stats)
            if stats is not None:
                stats.record(msg.stats)
            if self.slo_logger is not None:
                # The request's finished delta came in this message: it is still live.
                for f in msg.stats.finished:
                    live = self._live.get(f.request_id)
                    if live is not None:
                        self.slo_logger.record_finished(live.slo_class, f, live.predicted_ttft_s)

    def _on_result(self, msg: UtilityResult) -> None:
        future = self._calls.get(msg.call_id)
        if future is None or future.done():
            return
        if msg.error_type is None:
            future.set_result(msg.result)
        elif msg.error_type == "ValueError":
            future.set_exception(
                TunableError(msg.error_field, msg.error_message or "")
                if msg.error_field
                else ValueError(msg.error_message)
            )
        else:
            future.set_exception(RuntimeError(f"{msg.error_type}: {msg.error_message}"))

    def _on_core_exit(self) -> None:
        proc = self._process
        assert proc is not None  # the reader is added once the process exists
        self._loop.remove_reader(proc.sentinel)
        proc.join(1)
        self._die(self._dead_reason or f"engine core process {proc.pid} exited with code {proc.exitcode}")

    def _die(self, reason: str, notify: bool = True) -> None:
        if self._state == DEAD:
            return
        first = self._dead_reason is None
        self._state = DEAD
        self._dead_reason = reason
        if notify and not self._stopping:
            log.error("engine core is dead: %s", reason)
        error = EngineUnavailable(DEAD, self._dead_message())
        for live in self._live.values():
            live.error = error
            live.changed.set()
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._ready.set()
        if notify and first and not self._stopping and self.on_dead is not None:
            self.on_dead(reason)
