"""The engine: requests in, tokens out, one `step()` at a time.

request -> sequences -> scheduler / block manager -> model runner -> sampler -> outputs.
The engine is single-threaded: the server drives `step()` from its own thread and
hands it new requests, aborts and configuration changes between steps.

A step is plain data both ways. The scheduler's output goes in: its swaps to the KV
cache, its batch of ScheduledSeq to the runner (any ModelRunnerProtocol: ModelRunner,
or TPRunner for tensor_parallel_size > 1). A RunnerOutput comes out of
`runner.execute(batch)`, the only thing the engine reads of the step: the logits and,
on the fast decode path, the greedy tokens read with the finiteness check, or that
check still on the device. The step's tokens are the ones it carries or the sampler's
draw from its logits; the OutputProcessor turns them into outputs. With async
scheduling, AsyncDecode launches decode steps ahead of the host; their tokens (and any
logprobs) come back as PendingTokens, read one step later here. A request with
structured outputs waits in StructuredOutputs (engine/structured_outputs/grammar.py)
until its grammar is compiled; its rows' token masks then go to the sampler with the
logits.

The scheduler (engine/scheduling/async_scheduler.py) owns sequence and KV block state: the
engine asks it to schedule, advance a batch that ran, take the sampled tokens, plan a step
launched ahead and finish a sequence, and only reads its block manager. The configuration has one owner too, `live_config`
(engine/live_config.py): the scheduler, AsyncDecode and the runner (its mode) read it
there; reconfigure and a fast-path failure (the runner's `on_fastpath_failure`, where the
engine switches to fallback) change it there.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import torch

from .config import EngineConfig, TunableError
from .fast_path import attach_fast_path
from .kv.block_manager import BlockManager
from .kv.kv_cache import KVCache, KVShape
from .live_config import LiveConfig
from .memory.numa_memory import available_host_bytes, device_numa_node
from .model.loader import load_model, resolve_dtype
from .model.model_config import ModelConfig
from .output_processor import OutputProcessor
from .parallel import TPRunner
from .request.outputs import RequestOutput
from .request.prompt_logprobs import record as record_prompt_logprobs
from .request.request_validator import RequestLimits, RequestValidator
from .request.sampling_params import SamplingParams
from .request.sequence import Request, Sequence, SequenceStatus
from .request.slo import RequestSlo
from .runner.async_decode import AsyncDecode, InflightStep
from .runner.batch_invariant import make_batch_invariant
from .runner.batch_invariant_graphs import attach_invariant_decode
from .runner.model_runner import ModelRunner
from .runner.runner_protocol import ModelRunnerProtocol
from .sampling.sampler import NonFiniteLogits, Sampler
from .sampling.sampler import warm_up as warm_up_sampler
from .scheduling.async_scheduler import AsyncScheduler
from .scheduling.scheduler_output import ScheduledSeq
from .scheduling.ttft_predictor import TtftPredictor
from .stats import EngineCounters, KVSnapshot, StepStats, decode_weight_bytes, kv_tokens_read
from .structured_outputs.grammar import StructuredOutputs
from .text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

CPU_DEFAULT_KV_BYTES = 256 << 20


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked but CUDA is not available")
    return torch.device(name)


class LLMEngine:
    def __init__(self, config: EngineConfig):
        if not config.model:
            raise ValueError("EngineConfig.model must name a checkpoint directory")
        self.live_config = LiveConfig(config)  # the configuration's one owner: `config` reads it
        self.device = resolve_device(config.device)
        self.model_config = ModelConfig.from_dir(config.model)
        self.dtype = resolve_dtype(config.dtype, self.model_config, self.device)
        self.tokenizer = Tokenizer(config.model, list(self.model_config.eos_token_ids))
        tp = config.tensor_parallel_size
        self.model = (
            load_model(config.model, self.dtype, self.device, config.load_format, config.seed) if tp == 1 else None
        )  # TP: ranks load shards
        self.max_model_len = config.max_model_len or self.model_config.max_position_embeddings
        self.model_name = config.model

        mc = self.model_config
        shape = KVShape(mc.num_hidden_layers, config.block_size, mc.num_key_value_heads, mc.head_dim, self.dtype)
        self.kv_shape = shape
        self.block_bytes = shape.page_bytes
        self._kv_token_bytes = self.block_bytes // config.block_size  # every layer's K and V of one token
        self._decode_weight_bytes = decode_weight_bytes(self.model_config, self.dtype.itemsize)
        # With cold KV on from the start, its scale tables come out of the same budget.
        cold_kinds = (config.kv_cold_dtype,) if config.kv_cold_dtype != "none" else ()
        page_cost = shape.page_bytes + sum(shape.scale_bytes_per_page(k) for k in cold_kinds)
        num_blocks = self._kv_budget() // page_cost
        if num_blocks < 2:
            raise ValueError(f"kv_cache_bytes leaves {num_blocks} KV blocks of {page_cost} bytes; need at least 2")
        num_host_blocks = config.swap_space_bytes // page_cost
        self.host_numa_node = device_numa_node(self.device)
        self.ttft_predictor = TtftPredictor()  # fed each closed step; the scheduler's slack reads it
        self.scheduler = AsyncScheduler(
            self.live_config, num_blocks, num_host_blocks, shape.slots_per_page(), self.ttft_predictor
        )
        self._clamp_max_model_len()
        if tp > 1:  # rank 0 of a tensor-parallel group: its kv_cache sends swaps/quantizations to every rank
            tp_runner = TPRunner(
                config.model,
                mc,
                self.dtype,
                self.device,
                tp,
                num_blocks,
                num_host_blocks,
                config.block_size,
                self.live_config.current_mode,
                self.host_numa_node,
                cold_kinds,
                pages=self.block_manager.pool.pages,
            )
            self.model, self.kv_cache = tp_runner.model, tp_runner.kv_cache
            self.fast_path_unavailable = tp_runner.fast_path_unavailable
            self.runner: ModelRunnerProtocol = tp_runner
        else:
            self.kv_cache = KVCache(
                mc.num_hidden_layers,
                num_blocks,
                num_host_blocks,
                config.block_size,
                mc.num_key_value_heads,
                mc.head_dim,
                self.dtype,
                self.device,
                self.host_numa_node,
                cold_kinds=cold_kinds,
            )
            assert self.model is not None  # loaded above when tp == 1
            runner = ModelRunner(
                self.model,
                self.kv_cache,
                config.block_size,
                self.live_config.current_mode,
                pages=self.block_manager.pool.pages,
            )
            if config.deterministic:
                make_batch_invariant(self.model)
                self.fast_path_unavailable = attach_invariant_decode(runner, self.max_model_len)
            else:
                self.fast_path_unavailable = attach_fast_path(  # None: attached
                    runner, self.max_model_len, max_step_tokens=config.max_num_batched_tokens
                )
            self.runner = runner
        self.runner.on_fastpath_failure = self._on_fastpath_failure
        self.runner.on_fastpath_bug = self._on_fastpath_bug
        # Keyed by config.seed for unseeded rows; seeded rows depend on their own seed only.
        self.sampler = Sampler(self.device, self.model_config.vocab_size, list(mc.eos_token_ids), config.seed)
        self.requests: dict[str, Request] = {}
        self._token_texts: dict[int, str] = {}  # single-token decodes, for prompt logprobs
        self.counters = EngineCounters()
        self.last_step: StepStats | None = None
        self.async_decode = AsyncDecode(
            runner=self.runner,
            scheduler=self.scheduler,
            config=self.live_config,
            max_model_len=self.max_model_len,
            device=self.device,
            counters=self.counters,
            sampler=self.sampler,
        )
        self._inflight: InflightStep | None = None  # a decode step launched, tokens not read yet
        self.validator = RequestValidator(self.tokenizer, self.request_limits)
        self.output_processor = OutputProcessor(self.tokenizer, self.scheduler, self.counters, self.max_model_len)
        # Grammars compile in its worker processes; their requests wait there, not in the scheduler.
        self.structured = StructuredOutputs(
            self.tokenizer,
            self.model_config.vocab_size,
            self.device,
            num_workers=config.grammar_compile_workers,
            compile_timeout_s=config.grammar_compile_timeout_s,
            max_queued=config.max_queued_grammars,
            cache_bytes=config.grammar_cache_bytes,
        )
        # Requests this step finished because their grammar did not compile, with the reason:
        # a client error the server reports instead of their aborted output.
        self.rejected: dict[str, str] = {}
        if self.device.type == "cuda":  # CUDA loads each kernel's module on first use: the sampler's now
            try:
                warm_up_sampler(self.device, self.model_config.vocab_size, list(self.model_config.eos_token_ids))
            except Exception as exc:  # the first sampled request loads them then
                log.warning("sampler warm-up failed (%s: %s)", type(exc).__name__, exc)
        log.info(
            "engine: %s on %s (%s), %d KV blocks of %d tokens (%d MiB), %d host blocks on NUMA node %s",
            self.model_name,
            self.device,
            self.dtype,
            num_blocks,
            config.block_size,
            num_blocks * self.block_bytes >> 20,
            num_host_blocks,
            self.host_numa_node,
        )

    @property
    def config(self) -> EngineConfig:
        """The configuration in force (its owner: `live_config`)."""
        return self.live_config.current

    @config.setter
    def config(self, config: EngineConfig) -> None:  # a benchmark switching a field for one run
        self.live_config.commit(config)

    @property
    def block_manager(self) -> BlockManager:
        """The scheduler's, to read (pool sizes, prefix-cache counters); only the scheduler changes it."""
        return self.scheduler.block_manager

    def _clamp_max_model_len(self) -> None:
        """Bound max_model_len by the tokens one sequence can hold (the pool less its
        watermark). Generation stops at max_model_len, so no sequence can then outgrow
        the pool and preempt itself for ever. vLLM refuses to start instead; a small
        pool here still serves the requests that fit."""
        bm = self.block_manager
        pool_tokens = (bm.pool.num_blocks - bm.watermark_blocks) * self.config.block_size
        if self.max_model_len > pool_tokens:
            log.warning(
                "max_model_len %d clamped to %d: the KV pool holds %d blocks of %d tokens for one sequence",
                self.max_model_len,
                pool_tokens,
                pool_tokens // self.config.block_size,
                self.config.block_size,
            )
            self.max_model_len = pool_tokens

    def _kv_budget(self) -> int:
        if self.config.kv_cache_bytes:
            return self.config.kv_cache_bytes
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            used = total - free
            return max(0, int(total * self.config.gpu_memory_utilization) - used - (1 << 30))  # 1 GiB for activations
        return CPU_DEFAULT_KV_BYTES

    # --- requests ---------------------------------------------------------------
    def validate_request(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """Token ids of a valid prompt; a ValueError naming the problem otherwise.
        Pure (no engine state changes), so the server may call it from any thread."""
        return self.validator.validate(prompt, params)

    @property
    def request_limits(self) -> RequestLimits:
        bm = self.block_manager
        return RequestLimits(
            self.model_config.vocab_size,
            self.max_model_len,
            self.config.block_size,
            bm.pool.num_blocks - bm.watermark_blocks,
        )

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        prompt_token_ids: list[int] | None = None,
        arrival_time: float | None = None,
        slo: RequestSlo | None = None,
    ) -> None:
        """Queue a request; `slo` (None: best effort) gives its sequences a deadline the
        scheduler orders by."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        ids = prompt_token_ids if prompt_token_ids is not None else self.validate_request(prompt, params)
        arrival = arrival_time if arrival_time is not None else time.time()
        seqs = [
            Sequence(request_id, i, ids, params, priority, arrival, self.scheduler.step_count, slo)
            for i in range(params.n)
        ]
        self.requests[request_id] = Request(
            request_id,
            prompt if isinstance(prompt, str) else None,
            ids,
            params,
            seqs,
            arrival,
            prompt_logprobs=[None] * len(ids) if params.prompt_logprobs is not None else None,
        )
        if params.structured_outputs is not None:
            try:
                self.structured.hold(request_id, seqs, params.structured_outputs)
            except Exception:  # GrammarCompilerBusy: the request was never admitted
                del self.requests[request_id]
                raise
            return
        for seq in seqs:
            self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its blocks at once. False if it was not running."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        now = time.time()
        self.structured.drop(request_id)
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort", now)  # leaves the scheduler, frees its blocks
        self.counters.requests_finished["abort"] += 1
        return True

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    # --- the step ---------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step, schedule -> execute -> sample -> update; returns the outputs of the
        requests that got a token. With a decode step in flight (async scheduling), the step
        after it is launched (the scheduler plans it) before its tokens are read, so the
        host's update overlaps the device's next step."""
        start = time.perf_counter()
        if self.rejected:
            self.rejected = {}
        failed = self._admit_constrained() if self.structured.num_held else []
        if failed:
            return failed
        inflight = self._take_inflight()
        if inflight is None:
            batch, stats = self._schedule()
            inflight = self.async_decode.launch(batch, stats)  # execute, not waiting for its tokens
            if inflight is None:  # the synchronous step
                sampling = [item.seq for item in batch if item.completes]
                tokens, logprobs = self._execute_and_sample(batch, sampling)
                self._cool(self.scheduler.advance(batch))
                return self._update(sampling, tokens, logprobs, stats, start)
        self._cool(self.scheduler.advance(inflight.batch))  # the next step computes from there
        self._inflight = self.async_decode.launch_next(inflight)
        seqs, tokens, logprobs = self._read_tokens(inflight)
        return self._update(seqs, tokens, logprobs, inflight.stats, start)

    def _take_inflight(self) -> InflightStep | None:
        """The decode step in flight, unless every one of its sequences left meanwhile."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None and not any(item.seq.status is SequenceStatus.RUNNING for item in inflight.batch):
            inflight.tokens.synchronize()  # all its sequences finished or were aborted
            return None
        return inflight

    def _schedule(self) -> tuple[list[ScheduledSeq], StepStats]:
        """The scheduler's batch, after its swaps on the KV cache (counted), and the step's stats."""
        sched = self.scheduler.schedule()
        swap_start = time.perf_counter()
        self.kv_cache.swap(sched.swap_out, sched.swap_in)
        c = self.counters
        c.swap_seconds += time.perf_counter() - swap_start
        c.num_preemptions += len(sched.preempted)
        c.swap_in_faults += sched.num_swapped_in
        c.recompute_faults += sched.num_recompute_faults
        c.swap_out_bytes += sum(self._block_bytes_of(kind) for (kind, _, _), _ in sched.swap_out)
        c.swap_in_bytes += sum(self._block_bytes_of(kind) for (kind, _, _), _ in sched.swap_in)
        c.prefix_queries, c.prefix_hits = self.block_manager.prefix.queries, self.block_manager.prefix.hits
        batch = sched.scheduled
        return batch, StepStats(len(batch), sched.num_batched_tokens, kv_tokens_read=kv_tokens_read(batch))

    def _admit_constrained(self) -> list[RequestOutput]:
        """Requests whose grammar finished compiling join the scheduler; one that failed to
        compile finishes as aborted (its output is returned). With nothing else to run,
        wait a little for a grammar instead of spinning."""
        if not self.scheduler.waiting and not self.scheduler.running and self._inflight is None:
            self.structured.wait(timeout=0.01)
        ready, failed = self.structured.take_ready()
        for seq in ready:
            self.scheduler.add(seq)
        outputs = []
        now = time.time()
        for request_id, reason in failed.items():
            log.warning("request %s: its structured-outputs grammar did not compile: %s", request_id, reason)
            self.rejected[request_id] = reason
            req = self.requests.pop(request_id)
            for seq in req.seqs:
                self.scheduler.finish(seq, "abort", now)
            self.counters.requests_finished["abort"] += 1
            outputs.append(self.output_processor._output(req, True))
        return outputs

    def _update(
        self, seqs: list[Sequence], tokens: list[int], logprobs: list, stats: StepStats, start: float
    ) -> list[RequestOutput]:
        """The sampled tokens join their sequences (the scheduler's), then become outputs;
        sequences that stop are finished there."""
        outputs: list[RequestOutput] = []
        if seqs:
            self.scheduler.update_from_output(seqs, tokens)
            outputs = self.output_processor.process(self.requests, seqs, tokens, logprobs, time.time(), stats)
            self.structured.release_finished(seqs)
        return self._close_step(stats, start, outputs)

    def _close_step(self, stats: StepStats, start: float, outputs: list[RequestOutput]) -> list[RequestOutput]:
        stats.num_running = len(self.scheduler.running)
        stats.num_waiting = len(self.scheduler.waiting)
        stats.num_swapped = len(self.scheduler.swapped)
        stats.duration = time.perf_counter() - start
        if stats.batch_size and stats.num_batched_tokens == stats.batch_size:  # a pure decode step
            self.counters.decode_seconds += stats.duration
            self.counters.decode_bytes_read += self._decode_weight_bytes + stats.kv_tokens_read * self._kv_token_bytes
        self.ttft_predictor.observe(stats)
        self.last_step = stats
        return outputs

    def _read_tokens(self, inflight: InflightStep) -> tuple[list[Sequence], list[int], list]:
        """The launched step's tokens and logprobs (the step's one host synchronisation), for
        its sequences still running."""
        tokens, finite, logprobs = inflight.tokens.wait()
        if not finite:
            self._inflight = None  # launched from non-finite logits
            tokens, logprobs = self._rerun_on_fallback(inflight.batch)
        live = [
            (item.seq, token, lp)
            for item, token, lp in zip(inflight.batch, tokens, logprobs)
            if item.seq.status is SequenceStatus.RUNNING
        ]
        return [s for s, _, _ in live], [t for _, t, _ in live], [lp for _, _, lp in live]

    def _rerun_on_fallback(self, batch: list[ScheduledSeq]) -> tuple[list[int], list[dict[int, float] | None]]:
        """A step in flight read back non-finite (its deferred check): switch to the
        fallback path and compute the batch again there. Tokens and logprobs in batch
        order (-1 and None for rows that left)."""
        self.runner.non_finite_after_all()
        with self.scheduler.rerunning(batch) as rows:  # its tokens, counted already, are computed again
            tokens, logprobs = self.sampler.sample(self.runner.execute(rows).logits, [item.seq for item in rows])
        by_seq = {id(item.seq): answer for item, answer in zip(rows, zip(tokens, logprobs))}
        answers = [by_seq.get(id(item.seq), (-1, None)) for item in batch]
        return [token for token, _ in answers], [lp for _, lp in answers]

    def _record_prompt_logprobs(self, batch: list[ScheduledSeq], chunks: list | None) -> None:
        """Write the prompt tokens a step scored into their requests (every sibling of an
        n > 1 request scores the same prompt; whichever gets there writes the same values)."""
        if chunks is None:
            return
        for item, chunk in zip(batch, chunks):
            req = self.requests.get(item.seq.request_id)
            if chunk is not None and req is not None and req.prompt_logprobs is not None:
                record_prompt_logprobs(req.prompt_logprobs, chunk, self._token_text)

    def _token_text(self, token_id: int) -> str:
        # Cached: a long prompt's scores decode thousands of tokens inside the step; the
        # cache is bounded by the vocabulary.
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def _execute_and_sample(self, batch, sampling: list[Sequence]) -> tuple[list[int], list]:
        """Run the step, record the prompt tokens it scored (RunnerOutput.prompt_logprobs)
        and choose its tokens. On the fast decode path the non-finite check comes back
        with the tokens (one host sync); if it fails, the step runs again on the portable
        path (a seeded row's noise depends on its seed and position only: it draws the same)."""
        if not batch:
            return [], []
        output = self.runner.execute(batch)
        self._record_prompt_logprobs(batch, output.prompt_logprobs)
        if not sampling:
            return [], []
        if output.sampled_token_ids is not None:
            return output.sampled_token_ids, [None] * len(sampling)
        # After execute: on the decode graphs the runner returns before the device has the
        # logits (their finiteness check is deferred), so the fill overlaps the device's work.
        mask = self.structured.fill(sampling)
        try:
            result = self.sampler.sample(output.logits, sampling, finite=output.finite, mask=mask)
        except NonFiniteLogits:
            self.runner.non_finite_after_all()
            rerun = self.runner.execute(batch)
            self._record_prompt_logprobs(batch, rerun.prompt_logprobs)
            result = self.sampler.sample(rerun.logits, sampling, mask=mask)
        if mask is not None:
            self.structured.accept(sampling, result[0])
        return result

    def _cool(self, seqs: list[Sequence]) -> None:
        """Quantize the running sequences' full blocks that left the hot window (not in
        fallback: no quantized KV is written there, though existing cold blocks are still read)."""
        config = self.config
        kind = config.kv_cold_dtype
        if kind == "none" or config.mode == "fallback":
            return
        start = time.perf_counter()
        pairs = self.scheduler.cool(seqs, config.kv_hot_window, kind)
        if pairs:
            locate = self.block_manager.pool.pages.locate
            self.kv_cache.quantize([(hot, locate(cold)) for hot, cold in pairs])
            self.counters.quantized_blocks[kind] += len(pairs)
            self.counters.quantize_seconds += time.perf_counter() - start

    def _block_bytes_of(self, kind: str) -> int:
        return self.block_bytes if kind == "hot" else self.kv_shape.cold_block_bytes(kind)

    # --- run-time configuration ---------------------------------------------------
    def reconfigure(self, changes: dict[str, Any]) -> EngineConfig:
        """Apply tunable changes (call between steps). A transaction: every value is
        validated and every new buffer allocated before anything switches; a refusal or a
        failed allocation raises TunableError naming the field and changes nothing the
        engine reads (a cold kind's scale tables, once allocated, stay: unused until that
        kind is switched on). Returns the new configuration."""
        new = self.live_config.plan(changes)  # the one validation
        host_resize = None
        if "swap_space_bytes" in changes:
            host_resize = self._plan_swap_resize(new.swap_space_bytes)
        if self._inflight is not None:  # its copies are done before graphs are captured or buffers change
            self._inflight.tokens.synchronize()
        cold = changes.get("kv_cold_dtype", "none")
        if cold != "none" and not self.kv_cache.has_kind(cold):
            with _allocating("kv_cold_dtype", f"the {cold} scale tables"):
                self.kv_cache.enable_kind(cold)
            self.runner.refresh_kv_views()
        if host_resize is not None:
            with _allocating("swap_space_bytes", f"a host pool of {host_resize.new_pool.num_blocks} pages"):
                self.kv_cache.resize_host(host_resize.new_pool.num_blocks, host_resize.remap)
            self.scheduler.resize_host(host_resize)
        self.live_config.commit(new)
        return new

    def set_mode(self, mode: str) -> EngineConfig:
        return self.reconfigure({"mode": mode})

    def _plan_swap_resize(self, nbytes: int):
        pool = self.block_manager.host_pool
        num_pages = nbytes // self.block_bytes
        in_use = pool.num_blocks - pool.num_free_blocks
        if num_pages < in_use:
            raise TunableError(
                "swap_space_bytes",
                f"swap_space_bytes={nbytes} holds {num_pages} host pages; {in_use} are in use by swapped-out sequences",
            )
        available = available_host_bytes()
        needed = num_pages * self.block_bytes
        if available is not None and needed > available:
            raise TunableError(
                "swap_space_bytes",
                f"swap_space_bytes={nbytes} needs {needed / 2**30:.1f} GiB of "
                f"host memory; this host has {available / 2**30:.1f} GiB available (MemAvailable)",
            )
        return self.scheduler.plan_host_resize(num_pages)

    def _on_fastpath_failure(self, reason: str) -> None:
        self.counters.fastpath_failures[reason] += 1
        self.live_config.commit(self.live_config.plan({"mode": "fallback"}))

    def _on_fastpath_bug(self, reason: str) -> None:
        """A step met a bug in the fast path's launch code: counted; the mode stays."""
        self.counters.fastpath_launch_errors[reason] += 1

    # --- observation ----------------------------------------------------------------
    def kv_snapshot(self) -> KVSnapshot:
        bm = self.block_manager
        bs = self.config.block_size
        free_blocks = bm.pool.num_free_blocks
        tail_slack = sum(len(s.block_table) * bs - s.num_tokens for s in self.scheduler.running if s.block_table)
        # Paged KV has no external fragmentation (any free block serves any sequence); what
        # is lost is the unfilled tail of each sequence's last block. A full pool with a
        # request waiting is pressure, not fragmentation, and reads as such elsewhere.
        allocated_slots = bm.num_used_blocks * bs
        by_kind = bm.blocks_by_kind()
        return KVSnapshot(
            num_blocks=bm.pool.num_blocks,
            num_used=bm.num_used_blocks,
            num_free=free_blocks,
            num_cached=bm.pool.num_cached_free_blocks,
            fragmentation_ratio=min(1.0, max(0, tail_slack) / allocated_slots) if allocated_slots else 0.0,
            num_host_blocks=bm.host_pool.num_blocks,
            num_host_free=bm.host_pool.num_free_blocks,
            blocks_by_dtype=by_kind,
            bytes_saved=sum(
                n * (self.block_bytes - self.kv_shape.cold_block_bytes(k)) for k, n in by_kind.items() if k != "hot"
            ),
        )


@contextlib.contextmanager
def _allocating(name: str, what: str):
    """Turn an allocation failure into a TunableError naming the field."""
    try:
        yield
    except (RuntimeError, MemoryError) as exc:  # torch's out-of-memory errors are RuntimeErrors
        raise TunableError(name, f"{name}: could not allocate {what}: {exc}; nothing was changed") from None
