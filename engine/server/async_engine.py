"""The engine thread and the asyncio side that feeds it.

`LLMEngine` is not thread-safe, so exactly one thread owns it. HTTP handlers talk to
it through a command queue (add, abort, reconfigure, set mode, inject a fault); the
thread drains the queue between steps, so a change never lands mid-step, then steps.
Each step's outputs go back to the event loop in one `call_soon_threadsafe`, where
they are routed to per-request asyncio queues. Idle, the thread sleeps on a
condition variable.

After each step the thread also feeds the metrics logger, the request tracer and a
lock-protected `EngineSnapshot` that /metrics reads, so no other thread touches the
engine.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from ..llm_engine import LLMEngine
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from .snapshot import EngineSnapshot, take_snapshot

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine thread stopped; the server cannot serve requests."""


class RequestFailed(RuntimeError):
    """The engine raised while serving this request (a server fault, not a client one)."""


@dataclass(slots=True)
class _Live:
    params: SamplingParams
    queue: asyncio.Queue


class AsyncEngine:
    def __init__(self, engine: LLMEngine, stat_logger=None, tracer=None):
        self.engine = engine
        self.stat_logger = stat_logger
        self.tracer = tracer  # RequestTracer or None
        self._commands: deque[Callable[[], None]] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live: dict[str, _Live] = {}  # event-loop side
        self._params: dict[str, SamplingParams] = {}  # engine-thread side
        self._snapshot_lock = threading.Lock()
        self._snapshot = take_snapshot(engine, time.time())
        self.fatal_error: BaseException | None = None

    # --- lifecycle (event loop) ------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.fatal_error is None

    def snapshot(self) -> EngineSnapshot:
        with self._snapshot_lock:
            return self._snapshot

    # --- commands ------------------------------------------------------------------------
    def _post(self, command: Callable[[], None]) -> None:
        if not self.is_alive:
            raise EngineDeadError(f"engine thread is not running ({self.fatal_error or 'stopped'})")
        with self._cond:
            self._commands.append(command)
            self._cond.notify()

    async def call(self, fn: Callable[[LLMEngine], Any]) -> Any:
        """Run fn(engine) in the engine thread between steps; its result or exception."""
        future: concurrent.futures.Future = concurrent.futures.Future()

        def command() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(self.engine))
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)
            self._publish_snapshot()

        self._post(command)
        return await asyncio.wrap_future(future)

    async def reconfigure(self, changes: dict[str, Any]):
        return await self.call(lambda e: e.reconfigure(changes))

    async def set_mode(self, mode: str):
        return await self.call(lambda e: e.set_mode(mode))

    async def inject_fastpath_failure(self, reason: str) -> None:
        await self.call(lambda e: e.runner.inject_fastpath_failure(reason))

    # --- requests ------------------------------------------------------------------------
    async def generate(self, request_id: str, prompt: str | list[int], prompt_token_ids: list[int],
                       params: SamplingParams, priority: int = 0,
                       trace_headers: dict[str, str] | None = None) -> AsyncIterator[RequestOutput]:
        """Cumulative outputs of one request until it finishes. Leaving early (the client
        went away, the task was cancelled) aborts the request in the engine at once."""
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already in use")
        queue: asyncio.Queue = asyncio.Queue()
        self._live[request_id] = _Live(params, queue)
        arrival = time.time()
        finished = False
        try:
            self._post(lambda: self._add(request_id, prompt, prompt_token_ids, params, priority, arrival,
                                         trace_headers))
            while True:
                item = await queue.get()
                # Outputs are cumulative: when the consumer fell behind, the newest says it all.
                while not queue.empty() and not isinstance(item, BaseException) and not item.finished:
                    item = queue.get_nowait()
                if isinstance(item, BaseException):
                    finished = True  # the engine already dropped it
                    raise item
                if item.finished:
                    finished = True
                yield item
                if finished:
                    return
        finally:
            self._live.pop(request_id, None)
            if not finished and self.is_alive:
                self._post(lambda: self._abort(request_id))

    def _deliver(self, outputs: list[RequestOutput]) -> None:  # event loop
        for out in outputs:
            live = self._live.get(out.request_id)
            if live is not None:
                live.queue.put_nowait(out)

    def _deliver_error(self, request_id: str, exc: BaseException) -> None:  # event loop
        live = self._live.get(request_id)
        if live is not None:
            live.queue.put_nowait(exc)

    # --- engine thread -------------------------------------------------------------------
    def _add(self, request_id, prompt, prompt_token_ids, params, priority, arrival, trace_headers=None) -> None:
        try:
            self.engine.add_request(request_id, prompt, params, priority=priority,
                                    prompt_token_ids=prompt_token_ids, arrival_time=arrival)
        except Exception as exc:
            self._loop.call_soon_threadsafe(self._deliver_error, request_id, exc)
            return
        self._params[request_id] = params
        if self.tracer is not None:
            self.tracer.queued(request_id, len(prompt_token_ids), params, priority, int(arrival * 1e9),
                               trace_headers)

    def _abort(self, request_id: str) -> None:
        self._params.pop(request_id, None)
        if self.engine.abort(request_id) and self.tracer is not None:
            self.tracer.finished(request_id, "abort", 0)

    def _run(self) -> None:
        try:
            self._loop_forever()
        except BaseException as exc:  # a bug in the loop itself: report, fail everything
            log.exception("engine thread died")
            self.fatal_error = exc
            self._fail_all(exc)

    def _loop_forever(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while not self._commands and not engine.has_unfinished() and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                commands = list(self._commands)
                self._commands.clear()
            for command in commands:
                command()
            if not engine.has_unfinished():
                self._publish_snapshot()
                continue
            try:
                outputs = engine.step()
            except Exception as exc:
                log.exception("engine step failed; failing the requests in flight")
                self._fail_all(exc)
                if getattr(exc, "fatal", False):
                    # The engine cannot step again (a tensor-parallel worker died): report
                    # unhealthy and exit, so the agent's supervisor starts a fresh engine.
                    self.fatal_error = exc
                    if self._loop is not None:
                        self._loop.call_soon_threadsafe(self._exit_soon)
                    return
                continue
            self._after_step(outputs)

    def _exit_soon(self, delay_s: float = 1.0, code: int = 70) -> None:
        """Leave the failed requests' error responses a moment to go out, then exit
        non-zero (70, EX_SOFTWARE)."""
        log.critical("engine is unusable (%s); exiting with code %d in %.1f s", self.fatal_error, code, delay_s)
        self._loop.call_later(delay_s, os._exit, code)

    def _after_step(self, outputs: list[RequestOutput]) -> None:
        engine = self.engine
        if self.stat_logger is not None:
            self.stat_logger.record(engine.last_step)
        if self.tracer is not None:
            self.tracer.after_step(engine.requests)
        for out in outputs:
            if out.finished:
                params = self._params.pop(out.request_id, None)
                num_gen = sum(len(o.token_ids) for o in out.outputs)
                if self.stat_logger is not None and params is not None:
                    self.stat_logger.record_request(params.n, params.max_tokens,
                                                    max(len(o.token_ids) for o in out.outputs))
                if self.tracer is not None:
                    self.tracer.finished(out.request_id, out.outputs[0].finish_reason or "abort", num_gen)
        self._publish_snapshot()
        if outputs:
            self._loop.call_soon_threadsafe(self._deliver, outputs)

    def _fail_all(self, exc: BaseException) -> None:
        engine = self.engine
        for request_id in list(engine.requests):
            try:
                engine.abort(request_id)
            except Exception:
                log.exception("abort of %s after a failed step failed too", request_id)
            self._params.pop(request_id, None)
            if self.tracer is not None:
                self.tracer.finished(request_id, "abort", 0, error=repr(exc))
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._deliver_error, request_id,
                                                RequestFailed(f"engine step failed: {type(exc).__name__}: {exc}"))
        try:
            self._publish_snapshot()
        except Exception:
            log.exception("snapshot after a failed step failed")

    def _publish_snapshot(self) -> None:
        snap = take_snapshot(self.engine, time.time())
        with self._snapshot_lock:
            self._snapshot = snap
