"""Grammar compiling in worker processes, bounded in time, in queue length and in size.

xgrammar compiles in C++ and cannot be interrupted from Python: a thread compiling a
100,000-value enum keeps the cores busy for minutes after its client has gone and keeps
the memory it grew. A worker here is a process instead, so killing it frees both at once.

- A compile past `timeout_s`, or one whose requests have all gone (`abandon`), kills its
  worker; the next job starts a fresh one.
- At most `max_queued` jobs wait for a worker; the next is refused with
  GrammarCompilerBusy (the server answers 503 with Retry-After). So one client's grammar
  delays another's by at most about (max_queued / num_workers + 1) x timeout_s.
- A compiled grammar larger than `max_grammar_bytes` is refused (it would not fit the cache).

The grammar comes back as xgrammar's JSON and is rebuilt against the engine's
TokenizerInfo. A worker starts at the first compile (importing xgrammar takes seconds),
so engines that never see a constrained request never start one.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from .params import StructuredOutputsParams

log = logging.getLogger(__name__)

WORKER_START_TIMEOUT_S = 120.0  # importing xgrammar (and torch) in a fresh process
_POLL_S = 0.05
_PR_SET_PDEATHSIG = 1


class GrammarCompilerBusy(RuntimeError):
    """Too many grammars wait to compile: try again later."""

    reason = "grammar_compiler_busy"


class GrammarCompileFailed(ValueError):
    """The grammar did not compile: invalid, too slow, too large, or its requests left."""


@dataclass(slots=True, eq=False)  # by identity: jobs sit in a set
class _Job:
    params: StructuredOutputsParams
    future: Future[Any] = field(default_factory=Future)
    is_abandoned: bool = False


class _Worker:
    def __init__(
        self, build_grammar: Callable[[StructuredOutputsParams], Any], tokenizer_json: str, max_grammar_bytes: int
    ):
        self._kill_lock = threading.Lock()
        self.is_killed = False
        ctx = multiprocessing.get_context("spawn")  # the engine has threads (and maybe CUDA): never fork
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(
            target=serve_compiles,
            args=(child_conn, build_grammar, tokenizer_json, max_grammar_bytes),
            name="inferd-grammar",
            daemon=True,
        )
        self.process.start()
        child_conn.close()
        if not self.conn.poll(WORKER_START_TIMEOUT_S):
            self.kill()
            raise GrammarCompileFailed("the grammar compiler process did not start")
        self.conn.recv()  # "ready"

    def kill(self) -> None:
        """Idempotent: close() and the worker's own slot may both get here, and a second
        close of the pipe's descriptor could close one reused by another file."""
        with self._kill_lock:
            if self.is_killed:
                return
            self.is_killed = True
            if self.process.is_alive():
                self.process.kill()
            self.process.join(timeout=5)
            self.conn.close()


class GrammarCompiler:
    """Compiles StructuredOutputsParams into xgrammar CompiledGrammars on worker processes.
    `build_grammar` turns the params into an xgrammar Grammar (in the worker; a module-level
    function, passed by name); `tokenizer_info` builds the engine's xgrammar.TokenizerInfo
    (called once, on a worker thread)."""

    def __init__(
        self,
        build_grammar: Callable[[StructuredOutputsParams], Any],
        tokenizer_info: Callable[[], Any],
        *,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        max_queued: int = 16,
        max_grammar_bytes: int = 256 << 20,
    ):
        if num_workers < 1 or timeout_s <= 0 or max_queued < 0 or max_grammar_bytes < 1:
            raise ValueError("num_workers >= 1, timeout_s > 0, max_queued >= 0 and max_grammar_bytes >= 1 required")
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.max_queued = max_queued
        self.max_grammar_bytes = max_grammar_bytes
        self._build_grammar = build_grammar
        self._make_tokenizer_info = tokenizer_info
        self._tokenizer_info: Any = None
        self._tokenizer_json: str | None = None
        self._queue: deque[_Job] = deque()
        self._running: set[_Job] = set()
        self._cond = threading.Condition()
        self._tokenizer_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._workers: set[_Worker] = set()
        self._is_closed = False
        self.num_killed = 0

    def submit(self, params: StructuredOutputsParams) -> Future[Any]:
        with self._cond:
            if self._is_closed:
                raise RuntimeError("the grammar compiler is closed")
            if len(self._queue) >= self.max_queued + max(0, self.num_workers - len(self._running)):
                raise GrammarCompilerBusy(
                    f"{len(self._queue)} structured-output grammars are waiting to compile; try again later"
                )
            job = _Job(params)
            self._queue.append(job)
            if len(self._threads) < self.num_workers:
                thread = threading.Thread(target=self._serve_slot, name="grammar", daemon=True)
                self._threads.append(thread)
                thread.start()
            self._cond.notify()
        return job.future

    def abandon(self, future: Future[Any]) -> None:
        """Nobody waits for this grammar any more: drop it from the queue, or kill the
        worker compiling it."""
        with self._cond:
            for job in self._queue:
                if job.future is future:
                    self._queue.remove(job)
                    future.cancel()
                    return
            for job in self._running:
                if job.future is future:
                    job.is_abandoned = True

    def close(self) -> None:
        with self._cond:
            self._is_closed = True
            for job in self._queue:
                job.future.cancel()
            self._queue.clear()
            for job in self._running:
                job.is_abandoned = True
            self._cond.notify_all()
            workers = list(self._workers)
        for worker in workers:
            worker.kill()

    # --- a slot: one thread driving one worker process at a time ---------------------------
    def _serve_slot(self) -> None:
        worker: _Worker | None = None
        while True:
            with self._cond:
                while not self._queue and not self._is_closed:
                    self._cond.wait()
                if self._is_closed:
                    break
                job = self._queue.popleft()
                self._running.add(job)
            try:
                if not job.future.set_running_or_notify_cancel():
                    continue
                try:
                    worker = worker or self._start_worker()
                    job.future.set_result(self._compile_on(worker, job))
                except _WorkerGone as gone:
                    worker = None
                    job.future.set_exception(GrammarCompileFailed(str(gone)))
                except Exception as exc:
                    job.future.set_exception(exc if isinstance(exc, GrammarCompileFailed) else _failed(exc))
            finally:
                with self._cond:
                    self._running.discard(job)
        if worker is not None:
            self._discard(worker)

    def _start_worker(self) -> _Worker:
        if self._tokenizer_json is None:
            with self._tokenizer_lock:  # the slots share one TokenizerInfo
                if self._tokenizer_json is None:
                    self._tokenizer_info = self._make_tokenizer_info()
                    self._tokenizer_json = self._tokenizer_info.serialize_json()
        worker = _Worker(self._build_grammar, self._tokenizer_json, self.max_grammar_bytes)
        with self._cond:
            self._workers.add(worker)
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._cond:
            self._workers.discard(worker)

    def _compile_on(self, worker: _Worker, job: _Job) -> Any:
        import xgrammar as xgr

        worker.conn.send(job.params)
        deadline = time.monotonic() + self.timeout_s
        while not worker.conn.poll(_POLL_S):
            reason = None
            if job.is_abandoned:
                reason = "the grammar's requests have all gone"
            elif time.monotonic() > deadline:
                reason = (
                    f"the structured-output grammar did not compile within {self.timeout_s:g} s "
                    "(grammar_compile_timeout_s); simplify the schema, regex or grammar"
                )
            elif not worker.process.is_alive():
                reason = "the grammar compiler process died"
            if reason is not None:
                self.num_killed += 1
                self._discard(worker)
                log.warning("grammar compile stopped, worker killed: %s", reason)
                raise _WorkerGone(reason)
        try:
            status, payload = worker.conn.recv()
        except (EOFError, OSError):
            self._discard(worker)
            raise _WorkerGone("the grammar compiler process died") from None
        if status != "ok":
            raise GrammarCompileFailed(payload)
        return xgr.CompiledGrammar.deserialize_json(payload, self._tokenizer_info)


class _WorkerGone(Exception):
    pass


def _failed(exc: BaseException) -> GrammarCompileFailed:
    return GrammarCompileFailed(f"the grammar did not compile: {type(exc).__name__}: {exc}")


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the closed pipe still ends the worker once its compile returns


def serve_compiles(
    conn: Connection,
    build_grammar: Callable[[StructuredOutputsParams], Any],
    tokenizer_json: str,
    max_grammar_bytes: int,
) -> None:
    """A worker process: compile each StructuredOutputsParams received, reply
    ("ok", grammar JSON) or ("error", reason); end when the engine closes the pipe."""
    _die_with_parent()
    parent = os.getppid()
    import xgrammar as xgr

    if os.getppid() != parent:
        return
    compiler = xgr.GrammarCompiler(
        xgr.TokenizerInfo.deserialize_json(tokenizer_json), max_threads=1, cache_enabled=False
    )
    conn.send("ready")
    while True:
        try:
            params = conn.recv()
        except (EOFError, OSError):
            return
        try:
            compiled = compiler.compile_grammar(build_grammar(params))
            size = compiled.memory_size_bytes
            if size > max_grammar_bytes:
                reply = (
                    "error",
                    f"the compiled grammar takes {size} bytes, more than grammar_cache_bytes ({max_grammar_bytes})",
                )
            else:
                reply = ("ok", compiled.serialize_json())
        except Exception as exc:
            reply = ("error", str(exc))
        conn.send(reply)
