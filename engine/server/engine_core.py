"""The engine core process: owns `LLMEngine` and steps it, never waiting on HTTP work.

The API server process (engine/server/core_client.py) starts this process and talks
to it over two ZeroMQ channels (engine/server/core_messages.py). The loop:

    drain every queued message (add, abort, utility call, shutdown) -> one step ->
    send that step's deltas, its StepStats and, at most every `snapshot_interval_s`
    (and whenever the engine turns idle), an EngineSnapshot for /metrics

so a command never lands mid-step. Idle, the loop waits on the input channel and
sends a heartbeat every `heartbeat_s`: the API side counts the core as stalled when it
hears nothing for longer than its bound, busy or idle.

SIGTERM and SIGINT are ignored here: the server drains first and then sends Shutdown
(the agent signals the whole process group). The core exits on its own when the
process that started it is gone.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from ..config import EngineConfig
from ..llm_engine import LLMEngine
from ..request.outputs import RequestOutput
from ..structured_outputs.compiler import GrammarCompilerBusy
from .core_messages import (
    AbortRequests,
    AddRequest,
    CoreFailed,
    CoreReady,
    Heartbeat,
    RequestDelta,
    RequestError,
    SeqDelta,
    Shutdown,
    StepOutputs,
    UtilityCall,
    UtilityResult,
    encoder,
    to_core_decoder,
)
from .parent_death import follow_parent
from .snapshot import take_snapshot

log = logging.getLogger(__name__)

EXIT_FATAL = 70  # EX_SOFTWARE: the engine cannot step again


@dataclass(slots=True)
class CoreOptions:
    config: EngineConfig
    input_address: str  # the core PULLs commands here
    output_address: str  # and PUSHes outputs here
    parent_pid: int
    otlp_endpoint: str | None = None
    heartbeat_s: float = 1.0
    snapshot_interval_s: float = 0.25  # kv_snapshot walks the block pool: ~10 % of an H200 burst at 0.05
    log_level: str = "INFO"
    torch_num_threads: int | None = None  # None: torch's default (one per core)
    engine_factory: Callable[[EngineConfig], Any] | None = None  # a picklable callable; LLMEngine by default

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_s <= 60:
            raise ValueError(f"heartbeat_s must be in (0, 60], got {self.heartbeat_s!r}")
        if self.snapshot_interval_s < 0:
            raise ValueError(f"snapshot_interval_s must be >= 0, got {self.snapshot_interval_s!r}")


def run_engine_core(options: CoreOptions) -> None:
    """Process entry point (multiprocessing spawn target)."""
    logging.basicConfig(
        level=options.log_level, format="%(asctime)s %(levelname)s engine-core %(name)s: %(message)s", stream=sys.stderr
    )
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the loop below notices a vanished server within a heartbeat; loading the model may
    # take minutes first
    if not follow_parent(options.parent_pid, signal.SIGKILL):
        log.warning("engine core: the API server process is gone; exiting")
        os._exit(0)
    ctx = zmq.Context()
    commands = ctx.socket(zmq.PULL)
    commands.connect(options.input_address)
    outputs = ctx.socket(zmq.PUSH)
    outputs.setsockopt(zmq.SNDHWM, 0)  # never block a step on a slow reader
    outputs.setsockopt(zmq.LINGER, 2000)
    outputs.connect(options.output_address)
    enc = encoder()
    tracer, provider = None, None
    try:
        _set_torch_threads(options)
        engine = (options.engine_factory or _default_engine)(options.config)
        if options.otlp_endpoint:
            from .tracing import RequestTracer, make_tracer  # OpenTelemetry's SDK, only when tracing

            otel_tracer, provider = make_tracer(options.otlp_endpoint)
            tracer = RequestTracer(otel_tracer)
    except Exception as exc:
        log.exception("engine core failed to start")
        outputs.send(enc.encode(CoreFailed(f"{type(exc).__name__}: {exc}")))
        outputs.close()
        os._exit(1)
    # What start-up allocated (the block pool's objects, model and torch state) lives as
    # long as the process: keep the collector from rescanning it (a full collection over
    # it paused a step by ~140 ms, measured on CPU with scripts/bench_host_overhead.py).
    gc.collect()
    gc.freeze()
    core = EngineCore(engine, outputs, options, tracer)
    outputs.send(
        enc.encode(
            CoreReady(
                os.getpid(),
                engine.request_limits,
                engine.config.tunables(),
                take_snapshot(engine, time.time()),
                engine.fast_path_unavailable,
            )
        )
    )
    code = core.run(commands)
    if provider is not None:
        provider.shutdown()  # flushes the spans still queued
    outputs.close()
    commands.close(linger=0)
    ctx.term()
    # os._exit: torch's and Triton's atexit hooks and extension destructors have nothing
    # left to do for a process that is going away, and print leak reports when they run.
    sys.stderr.flush()
    os._exit(code)


def _set_torch_threads(options: CoreOptions) -> None:
    """On the CPU, leave one core to the API server process: torch's intra-op threads
    spin-wait for each other, and one of them waiting for a core the server holds stalls
    every op (on two cores the engine core ran at a twentieth of its speed under load)."""
    import torch

    if options.torch_num_threads:
        torch.set_num_threads(options.torch_num_threads)
        return
    device = options.config.device
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        torch.set_num_threads(max(1, min(torch.get_num_threads(), len(os.sched_getaffinity(0)) - 1)))


def _default_engine(config: EngineConfig):
    return LLMEngine(config)


@dataclass(slots=True)
class _Sent:
    """What the API side already has of one sequence."""

    num_tokens: int = 0
    text: str = ""


class EngineCore:
    def __init__(self, engine, outputs: zmq.Socket, options: CoreOptions, tracer=None):
        self.engine = engine
        self.outputs = outputs
        self.options = options
        self.tracer = tracer
        self._encoder = encoder()
        self._sent: dict[str, list[_Sent]] = {}
        self._final_only: set[str] = set()  # requests whose outputs go out only when they finish
        self._errors: list[RequestError] = []
        self._snapshot_due = True
        self._last_snapshot = 0.0
        self._last_send = time.monotonic()

    # --- the loop ------------------------------------------------------------------
    def run(self, commands: zmq.Socket) -> int:
        """Serve until Shutdown (0), the parent's exit (0) or a fatal step (EXIT_FATAL)."""
        decoder = to_core_decoder()
        poller = zmq.Poller()
        poller.register(commands, zmq.POLLIN)
        heartbeat_ms = int(self.options.heartbeat_s * 1000)
        last_parent_check = time.monotonic()
        while True:
            timeout = 0 if self.engine.has_unfinished() else heartbeat_ms
            if poller.poll(timeout):
                while True:
                    try:
                        frame = commands.recv(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    if self._handle(decoder.decode(frame.buffer)) is Shutdown:
                        log.info("engine core: shutdown")
                        return 0
            now = time.monotonic()
            if now - last_parent_check >= self.options.heartbeat_s:
                last_parent_check = now
                if os.getppid() != self.options.parent_pid:
                    log.warning("engine core: the API server process is gone; exiting")
                    return 0
            if self.engine.has_unfinished():
                if not self._step():
                    return EXIT_FATAL
            elif self._errors or self._snapshot_due or now - self._last_send >= self.options.heartbeat_s:
                self._send_idle()

    def _handle(self, msg) -> Any:
        if isinstance(msg, AddRequest):
            self._add(msg)
        elif isinstance(msg, AbortRequests):
            for request_id in msg.request_ids:
                self._abort(request_id)
        elif isinstance(msg, UtilityCall):
            self._send(self._call(msg))
        elif isinstance(msg, Shutdown):
            return Shutdown
        if not isinstance(msg, AddRequest):  # an add is seen in the step it starts
            self._snapshot_due = True
        return None

    def _add(self, msg: AddRequest) -> None:
        try:
            self.engine.add_request(
                msg.request_id,
                msg.prompt if msg.prompt is not None else msg.prompt_token_ids,
                msg.params,
                priority=msg.priority,
                prompt_token_ids=msg.prompt_token_ids,
                arrival_time=msg.arrival_time,
                slo=msg.slo,
            )
        except ValueError as exc:
            self._errors.append(RequestError(msg.request_id, str(exc), True))
            return
        except GrammarCompilerBusy as exc:
            self._errors.append(RequestError(msg.request_id, str(exc), False, exc.reason))
            return
        self._sent[msg.request_id] = [_Sent() for _ in range(msg.params.n)]
        if msg.final_only:
            self._final_only.add(msg.request_id)
        if self.tracer is not None:
            self.tracer.queued(
                msg.request_id,
                len(msg.prompt_token_ids),
                msg.params,
                msg.priority,
                int(msg.arrival_time * 1e9),
                msg.trace_headers,
            )

    def _abort(self, request_id: str) -> None:
        self._sent.pop(request_id, None)
        self._final_only.discard(request_id)
        if self.engine.abort(request_id) and self.tracer is not None:
            self.tracer.finished(request_id, "abort", 0)

    def _call(self, msg: UtilityCall) -> UtilityResult:
        engine = self.engine
        try:
            if msg.method == "get_tunables":
                result = engine.config.tunables()
            elif msg.method == "reconfigure":
                result = engine.reconfigure(*msg.args).tunables()
            elif msg.method == "set_mode":
                result = engine.set_mode(*msg.args).tunables()
            elif msg.method == "inject_fastpath_failure":
                result = engine.runner.inject_fastpath_failure(*msg.args)
            elif msg.method == "inject_slow_swap":
                result = engine.kv_cache.inject_slow_swap(*msg.args)
            else:
                raise ValueError(f"unknown engine core method {msg.method!r}")
        except Exception as exc:
            if not isinstance(exc, ValueError):
                log.exception("engine core: %s failed", msg.method)
            kind = "ValueError" if isinstance(exc, ValueError) else type(exc).__name__
            return UtilityResult(msg.call_id, None, kind, str(exc), getattr(exc, "name", None))
        return UtilityResult(msg.call_id, result)

    # --- steps ----------------------------------------------------------------------
    def _step(self) -> bool:
        """One engine step and its message; False when the engine cannot step again."""
        engine = self.engine
        try:
            outputs = engine.step()
        except Exception as exc:
            log.exception("engine step failed; failing the requests in flight")
            self._fail_all(exc)
            self._snapshot_due = True
            self._send(StepOutputs([], self._take_errors(), None, self._maybe_snapshot()))
            if getattr(exc, "fatal", False):
                # A tensor-parallel worker died: exit so the supervisor starts a fresh engine.
                self._send(CoreFailed(f"engine cannot step again: {type(exc).__name__}: {exc}"))
                return False
            return True
        if self.tracer is not None:
            self.tracer.after_step(engine.requests)
        final_only = self._final_only
        rejected = getattr(engine, "rejected", None) or {}
        for request_id, reason in rejected.items():  # the client's grammar did not compile: a 400
            self._sent.pop(request_id, None)
            final_only.discard(request_id)
            if self.tracer is not None:
                self.tracer.finished(request_id, "abort", 0, error=reason)
            self._errors.append(RequestError(request_id, reason, True))
        deltas = [
            self._delta(out)
            for out in outputs
            if out.request_id not in rejected and (out.finished or out.request_id not in final_only)
        ]
        if not engine.has_unfinished():
            self._snapshot_due = True
        self._send(StepOutputs(deltas, self._take_errors(), engine.last_step, self._maybe_snapshot()))
        return True

    def _delta(self, out: RequestOutput) -> RequestDelta:
        sent = self._sent.get(out.request_id) or [_Sent() for _ in out.outputs]
        is_first = all(s.num_tokens == 0 for s in sent)
        seqs = []
        for o in out.outputs:
            s = sent[o.index]
            new_ids = o.token_ids_since(s.num_tokens)
            new_logprobs = o.logprobs_since(s.num_tokens)
            text = o.text
            if text.startswith(s.text):
                keep = len(s.text)
            else:  # a partial character rewritten, or a stop string cut the tail
                keep = len(os.path.commonprefix([text, s.text]))
            seqs.append(SeqDelta(o.index, new_ids, new_logprobs, keep, text[keep:], o.finish_reason, o.stop_reason))
            s.num_tokens += len(new_ids)
            s.text = text
        if out.finished:
            self._sent.pop(out.request_id, None)
            self._final_only.discard(out.request_id)
            if self.tracer is not None:
                self.tracer.finished(
                    out.request_id, out.outputs[0].finish_reason or "abort", sum(s.num_tokens for s in sent)
                )
        prompt_logprobs = out.prompt_logprobs if is_first else None
        return RequestDelta(out.request_id, seqs, out.finished, out.num_cached_tokens, prompt_logprobs)

    def _fail_all(self, exc: BaseException) -> None:
        message = f"engine step failed: {type(exc).__name__}: {exc}"
        for request_id in list(self.engine.requests):
            try:
                self.engine.abort(request_id)
            except Exception:
                log.exception("abort of %s after a failed step failed too", request_id)
            self._sent.pop(request_id, None)
            self._final_only.discard(request_id)
            if self.tracer is not None:
                self.tracer.finished(request_id, "abort", 0, error=repr(exc))
            self._errors.append(RequestError(request_id, message, False))

    # --- sending --------------------------------------------------------------------
    def _send_idle(self) -> None:
        if self._errors:
            self._send(StepOutputs([], self._take_errors(), None, self._maybe_snapshot()))
        else:
            self._send(Heartbeat(self._maybe_snapshot()))

    def _take_errors(self) -> list[RequestError]:
        errors, self._errors = self._errors, []
        return errors

    def _maybe_snapshot(self):
        now = time.monotonic()
        if not self._snapshot_due and now - self._last_snapshot < self.options.snapshot_interval_s:
            return None
        self._snapshot_due = False
        self._last_snapshot = now
        return take_snapshot(self.engine, time.time())

    def _send(self, msg) -> None:
        self.outputs.send(self._encoder.encode(msg), copy=False)
        self._last_send = time.monotonic()
