"""GPU decode benchmarks (run on the H200; see BENCHMARKS.md).

`inferd bench gpu-decode --out DIR` (or `python -m inferd.engine.bench.gpu_decode --out DIR`), with
the `llama3-8b-shape` preset in bf16:
1. ceilings: device-to-device copy bandwidth, bf16 matmul rate, pinned host<->device;
2. batch-1 decode on the fast path: tokens/s and model bandwidth utilisation (weight +
   KV bytes per token over the copy bandwidth), from the engine and from bare graph
   replays;
3. throughput: 256 requests of 512 prompt + 256 output tokens submitted at once, against
   the roofline bound (per step max(bytes / bandwidth, FLOPs / matmul rate), summed);
4. side by side: our fallback path and transformers `generate` (eager; static cache +
   torch.compile when time allows) at batch 1 and 32, each as a ratio to the fast path
   (the fast path and compiled transformers timed after an untimed run of the same
   shapes: the compile needs one; `--repeats N`: each timed N times, the median kept);
5. prefix caching: time to first token with a 2,048-token shared prefix, cold and warm,
   and warm with 8 to 256 new tokens as graph rows and through the eager forward;
6. swap: host<->device KV block copies against the pinned copy bandwidth;
7. deterministic mode against the default: greedy outputs alone and in a burst, speed
   (last: it switches the shared model to the batch-invariant steps).
Every figure goes to DIR/results.json; a table is printed last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from dataclasses import dataclass

import torch

from ..fast_path.cuda_graphs import DecodeInputs
from ..model.model_config import ModelConfig
from ..request.sampling_params import SamplingParams
from .deterministic import compare_modes, measure, mode_name
from .gpu_harness import (
    build,
    environment,
    free_dropped_engines,
    load_measured_configs,
    measure_ceilings,
    new_engine,
    prompts,
    run_requests,
    sync,
    time_cuda,
)
from .phase_timer import PhaseTimer
from .random_model import hf_model_sharing_weights


# --- the two numbers ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ModelCost:
    """Bytes and FLOPs of the Llama-family model per step, from its config."""

    cfg: ModelConfig
    dtype_bytes: int = 2

    @property
    def matmul_params(self) -> int:
        """Parameters every token multiplies through (all but the embedding table)."""
        c = self.cfg
        attn = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
        mlp = 3 * c.hidden_size * c.intermediate_size
        return c.num_hidden_layers * (attn + mlp) + c.vocab_size * c.hidden_size

    @property
    def weight_bytes_read(self) -> int:
        """Per step: every matmul weight once, the norms; one embedding row per token is noise."""
        c = self.cfg
        norms = (2 * c.num_hidden_layers + 1) * c.hidden_size
        return (self.matmul_params + norms) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        c = self.cfg
        return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * self.dtype_bytes

    def step(self, items: list[tuple[int, int]]) -> tuple[float, float]:
        """(bytes, FLOPs) of one step; items: (new tokens, context after the step) per sequence.
        Bytes: weights once, each sequence's context K/V read once, new K/V written.
        FLOPs: 2 per parameter per token, plus QK^T and PV over each token's context."""
        c = self.cfg
        tokens = sum(n for n, _ in items)
        kv_read = sum(ctx for _, ctx in items) * self.kv_bytes_per_token
        nbytes = self.weight_bytes_read + kv_read + tokens * self.kv_bytes_per_token
        attn_per_key = 4 * c.num_attention_heads * c.head_dim * c.num_hidden_layers
        keys = sum(sum(ctx - n + 1 + i for i in range(n)) for n, ctx in items)
        return float(nbytes), float(2 * self.matmul_params * tokens + attn_per_key * keys)


def roofline_seconds(cost: ModelCost, steps: list[list[tuple[int, int]]], bandwidth: float, flops_rate: float) -> float:
    return sum(max(b / bandwidth, f / flops_rate) for b, f in (cost.step(s) for s in steps))


def record_steps(engine, timings: list | None = None) -> list[list[tuple[int, int]]]:
    """Wrap the runner so each executed step's (new tokens, context) items are recorded,
    steps launched ahead by async scheduling too; with `timings`, also (seconds from the
    call to its result being ready, pure decode?) — that syncs after every step, so it
    also turns the overlap off. `unrecord_steps` restores the runner."""
    steps: list[list[tuple[int, int]]] = []
    runner = engine.runner

    def wrap(method):
        def recording(batch, *args, **kwargs):
            steps.append([(it.num_tokens, it.seq.num_computed_tokens + it.num_tokens) for it in batch])
            if timings is None:
                return method(batch, *args, **kwargs)
            start = time.perf_counter()
            result = method(batch, *args, **kwargs)
            sync()
            timings.append((time.perf_counter() - start, all(it.num_tokens == 1 for it in batch)))
            return result

        return recording

    runner.execute = wrap(runner.execute)
    if hasattr(runner, "launch_greedy_decode"):
        runner.launch_greedy_decode = wrap(runner.launch_greedy_decode)
    return steps


def unrecord_steps(engine) -> None:
    for name in ("execute", "launch_greedy_decode"):
        engine.runner.__dict__.pop(name, None)


def step_time_split(timings: list[tuple[float, bool]], total_s: float, steps: int, decode_steps: int) -> dict:
    """Runner (model) seconds of decode and of prefill/mixed steps, and the rest (host work)."""
    decode = sum(t for t, is_decode in timings if is_decode)
    other = sum(t for t, is_decode in timings if not is_decode)
    return {
        "runner_decode_s": decode,
        "runner_prefill_mixed_s": other,
        "host_and_sampling_s": total_s - decode - other,
        "runner_decode_ms_per_step": 1e3 * decode / max(decode_steps, 1),
        "runner_prefill_mixed_ms_per_step": 1e3 * other / max(steps - decode_steps, 1),
    }


def kernel_table(averages, row_limit: int = 25) -> str:
    """torch.profiler averages as a table by GPU time (the key torch >= 2.4 names
    self_device_time_total, older ones self_cuda_time_total), by CPU time without either."""
    for key in ("self_device_time_total", "self_cuda_time_total", "self_cpu_time_total"):
        try:
            return averages.table(sort_by=key, row_limit=row_limit)
        except (KeyError, AttributeError, ValueError):
            continue
    return ""


def profile_prefill(engine, vocab: int, path: str, num: int = 16, length: int = 512) -> None:
    """torch.profiler over one engine step that prefills `num` prompts of `length` tokens."""
    from torch.profiler import ProfilerActivity, profile

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    for attempt in range(2):  # the first round warms up; the second is profiled
        for i, p in enumerate(prompts(vocab, num, length, seed=40 + attempt)):
            engine.add_request(f"prof{attempt}-{i}", p, params)
        sync()
        if attempt:
            start = time.perf_counter()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                engine.step()
                sync()
            wall = time.perf_counter() - start
        while engine.has_unfinished():
            engine.step()
    averages = prof.key_averages()
    with open(path, "w") as f:
        f.write(f"one prefill step, {num} x {length} tokens, wall {wall * 1e3:.1f} ms\n")
        f.write(kernel_table(averages) + "\n")
        f.write(averages.table(sort_by="self_cpu_time_total", row_limit=25) + "\n")


def bench_engine_decode(engine, batch_prompts, max_tokens: int) -> dict:
    r = run_requests(engine, batch_prompts, max_tokens)
    decode_tokens = len(batch_prompts) * (max_tokens - 1)
    return {
        "tok_s": r["output_tokens"] / r["seconds"],
        "decode_tok_s": decode_tokens / r["decode_seconds"],
        "seconds": r["seconds"],
        "tokens": r["tokens"],
    }


def _load_rows(engine, size: int, context: int):
    """Fill the decode graphs' static inputs with `size` rows at `context` over random blocks."""
    graphs = engine.runner.fast_decode
    bs = engine.config.block_size
    nblocks = -(-context // bs)
    gen = torch.Generator().manual_seed(size)
    tables = [torch.randperm(engine.kv_cache.num_blocks, generator=gen)[:nblocks].tolist() for _ in range(size)]
    rows = DecodeInputs(
        [7] * size, [context - 1] * size, [t[-1] * bs + (context - 1) % bs for t in tables], [context] * size, tables
    )
    graphs._load(rows)
    return graphs


def bench_graph_replay(engine, size: int, context: int) -> float:
    """Seconds per bare replay of the size-`size` decode graph, every row at `context`."""
    graphs = _load_rows(engine, size, context)
    if (size, 0) not in graphs.graphs:
        graphs._capture(size)
    graph = graphs.graphs[size, 0][0]
    return time_cuda(graph.replay, repeat=20, warmup=3)


@contextlib.contextmanager
def pdl_setting(value: str):
    """INFERD_PDL set to `value` inside (it is read at each launch, so at graph capture),
    the caller's setting restored after."""
    previous = os.environ.get("INFERD_PDL")
    os.environ["INFERD_PDL"] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("INFERD_PDL", None)
        else:
            os.environ["INFERD_PDL"] = previous


def batch1_replay_ab(engine, context: int) -> dict[str, float]:
    """Bare batch-1 replay (ms) with the fused GEMVs against cuBLAS + separate small ops,
    with and without programmatic dependent launch (pdl.py); alternated captures, best of two."""
    graphs = engine.runner.fast_decode
    decoder, default = graphs.decoder, graphs.decoder.batch1_gemv
    runs: dict[str, list[float]] = {}
    try:
        for _ in range(2):
            for label, gemv_on, pdl in (
                ("gemv_pdl", True, "1"),
                ("gemv_no_pdl", True, "0"),
                ("cublas_pdl", False, "1"),
                ("cublas_no_pdl", False, "0"),
            ):
                decoder.batch1_gemv = gemv_on and default
                graphs.graphs.pop((1, 0), None)
                with pdl_setting(pdl):
                    runs.setdefault(label, []).append(bench_graph_replay(engine, 1, context) * 1e3)
    finally:
        decoder.batch1_gemv = default
        graphs.graphs.pop((1, 0), None)
        graphs._capture(1)
    return {label: min(times) for label, times in runs.items()}


def rows_replay_ab(engine, context: int, sizes=(2, 4, 8, 16, 32, 64)) -> dict[str, dict[str, float]]:
    """Bare replay (ms) of the decode graphs of 2-64 rows with the fused row kernels
    (triton_rows.py) against cuBLAS + separate small ops; alternated captures, best of two."""
    graphs = engine.runner.fast_decode
    decoder, default = graphs.decoder, graphs.decoder.rows_gemm
    runs: dict[str, dict[str, list[float]]] = {}
    try:
        for _ in range(2):
            for size in sizes:
                for label, rows_on in (("rows", True), ("cublas", False)):
                    decoder.rows_gemm = rows_on and default
                    graphs.graphs.pop((size, 0), None)
                    runs.setdefault(f"b{size}", {}).setdefault(label, []).append(
                        bench_graph_replay(engine, size, context) * 1e3
                    )
    finally:
        decoder.rows_gemm = default
        for size in sizes:
            graphs.graphs.pop((size, 0), None)
            graphs._capture(size)
    return {size: {label: min(times) for label, times in by.items()} for size, by in runs.items()}


def profile_decode(engine, size: int, context: int, path: str) -> None:
    """Per-kernel GPU time of the fused decode step run eagerly (torch.profiler), to a text file."""
    from torch.profiler import ProfilerActivity, profile

    graphs = _load_rows(engine, size, context)
    for _ in range(3):
        graphs._run(size)
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            graphs._run(size)
        sync()
    table = kernel_table(prof.key_averages(), row_limit=30)
    with open(path, "w") as f:
        f.write(f"fused decode step, batch {size}, context {context}, 5 eager runs\n{table}\n")


def median_run(runs: list[dict]) -> dict:
    """The run of median tok/s (the lower middle of an even count), with every run's
    tok/s as `tok_s_runs`: compiled transformers moved by 21% between single runs."""
    if not runs:
        raise ValueError("median_run needs at least one run")
    ordered = sorted(runs, key=lambda r: r["tok_s"])
    return {**ordered[(len(ordered) - 1) // 2], "tok_s_runs": [r["tok_s"] for r in runs]}


# --- transformers -------------------------------------------------------------------------
def bench_hf(hf, batch_prompts, max_tokens: int, compiled: bool = False, repeats: int = 1) -> dict:
    ids = torch.tensor(batch_prompts, device=hf.device)
    kwargs = dict(
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        do_sample=False,
        pad_token_id=0,
        attention_mask=torch.ones_like(ids),
    )
    with torch.inference_mode():
        if compiled:  # a static cache makes generate compile the forward (same shapes: warm up in full)
            kwargs["cache_implementation"] = "static"
            hf.generate(ids, **kwargs)
        else:
            hf.generate(
                ids[:, :16],
                **{**kwargs, "attention_mask": torch.ones_like(ids[:, :16]), "max_new_tokens": 4, "min_new_tokens": 4},
            )
        runs = []
        for _ in range(repeats):  # the same prompts each time: transformers keeps no prefix cache
            sync()
            start = time.perf_counter()
            out = hf.generate(ids, **kwargs)
            sync()
            elapsed = time.perf_counter() - start
            runs.append({"tok_s": len(batch_prompts) * max_tokens / elapsed, "seconds": elapsed})
    return {**median_run(runs), "tokens": out[:, ids.shape[1] :].tolist()}


# --- prefix caching and swap ----------------------------------------------------------------
def time_to_first_token(engine, prompt: list[int]) -> float:
    rid = f"ttft{time.monotonic_ns()}"
    sync()
    start = time.perf_counter()
    engine.add_request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    while engine.has_unfinished():
        if any(o.request_id == rid for o in engine.step()):
            break
    return time.perf_counter() - start


def profile_prefix(
    engine, vocab: int, path: str, prefix_len: int = 2048, new_tokens: int = 32, timed: int = 20, profiled: int = 5
) -> dict:
    """Where a warm-prefix TTFT goes: its host phases (median of `timed` warm requests,
    PhaseTimer) and per-kernel GPU time over `profiled` more (torch.profiler, whose CUDA
    instrumentation slows graph launches: the phases are timed without it). "runner" is
    the model step including its wait for the GPU and the token readback."""
    from torch.profiler import ProfilerActivity, profile

    prefix = prompts(vocab, 1, prefix_len, seed=21)[0]
    tails = prompts(vocab, 1 + timed + profiled, new_tokens, seed=22)
    time_to_first_token(engine, prefix + tails[0])  # cold: caches the prefix
    phases = {
        "schedule": (engine.scheduler, "schedule"),
        "runner": (engine.runner, "execute"),
        "outputs": (engine.output_processor, "process"),
    }
    if engine.runner.fast_decode is not None:
        phases["graph_inputs"] = (engine.runner.fast_decode, "_load")
    samples: dict[str, list[float]] = {name: [] for name in ("ttft", *phases)}
    with PhaseTimer(phases) as timer:
        for tail in tails[1 : 1 + timed]:
            timer.reset()
            samples["ttft"].append(time_to_first_token(engine, prefix + tail))
            for name, seconds in timer.totals.items():
                samples[name].append(seconds)
    medians = {name: 1e3 * sorted(v)[len(v) // 2] for name, v in samples.items()}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for tail in tails[1 + timed :]:
            time_to_first_token(engine, prefix + tail)
    averages = prof.key_averages()
    device_us = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in averages)
    result = {"host_phases_median_ms": medians, "gpu_ms_per_ttft": device_us / 1e3 / max(1, profiled)}
    with open(path, "w") as f:
        f.write(f"warm TTFT, {prefix_len} cached + {new_tokens} new tokens: {json.dumps(result)}\n")
        f.write(kernel_table(averages) + "\n")
    return result


def bench_prefix(
    engine, vocab: int, prefix_len: int = 2048, new_tokens: tuple[int, ...] = (8, 32, 64, 128, 256)
) -> dict:
    """TTFT of a 2,048-token prefix + 32 new tokens, cold then warm (the prefix cached);
    then warm TTFT for 8 to 256 new tokens with the new tokens as graph rows and with the
    eager forward (cuda_graphs.py: max_expanded_rows), best of two distinct tails each."""
    prefix = prompts(vocab, 1, prefix_len, seed=11)[0]
    a, b, c = (prompts(vocab, 1, 32, seed=s)[0] for s in (12, 13, 14))
    time_to_first_token(engine, prompts(vocab, 1, prefix_len + 32, seed=15)[0])  # warm the prefill kernels
    cold = time_to_first_token(engine, prefix + a)
    warm = time_to_first_token(engine, prefix + b)
    warm2 = time_to_first_token(engine, prefix + c)
    result: dict = {
        "cold_s": cold,
        "warm_s": min(warm, warm2),
        "speedup": cold / min(warm, warm2),
    }
    graphs = engine.runner.fast_decode
    if graphs is not None:
        limit, sweep = graphs.max_expanded_rows, {}
        result["max_expanded_rows"] = limit
        try:
            for i, n in enumerate(new_tokens):
                for way, rows in (("graph_rows", graphs.max_batch), ("eager", 0)):
                    graphs.max_expanded_rows = rows
                    tails = prompts(vocab, 3, n, seed=100 + 10 * i + (rows > 0))
                    time_to_first_token(engine, prefix + tails[0])  # first use of this shape
                    sweep[f"new{n}_{way}_ms"] = 1e3 * min(time_to_first_token(engine, prefix + t) for t in tails[1:])
        finally:
            graphs.max_expanded_rows = limit
        result["warm_by_new_tokens"] = sweep
    result["prefix_queries"] = engine.block_manager.prefix.queries
    result["prefix_hits"] = engine.block_manager.prefix.hits
    return result


def bench_swap(engine, num_blocks: int) -> dict:
    kv = engine.kv_cache
    num_blocks = min(num_blocks, kv.num_host_blocks, kv.num_blocks)
    out: list[tuple[tuple[str, int, int], tuple[str, int, int]]] | list[tuple[int, int]]
    if hasattr(kv, "device_pool"):  # page arena: pairs of (kind, page, slot)
        out = [(("hot", i, 0), ("hot", i, 0)) for i in range(num_blocks)]
    else:
        out = [(i, i) for i in range(num_blocks)]
    kv.swap(out, [])  # warm-up
    sync()
    t0 = time.perf_counter()
    kv.swap(out, [])
    t1 = time.perf_counter()
    kv.swap([], out)
    sync()
    t2 = time.perf_counter()
    nbytes = num_blocks * kv.block_bytes
    return {
        "blocks": num_blocks,
        "bytes": nbytes,
        "out_bytes_per_s": nbytes / (t1 - t0),
        "in_bytes_per_s": nbytes / (t2 - t1),
    }


# --- the run ----------------------------------------------------------------------------------
def bench_deterministic(model_dir, model, probes: int = 8, burst: int = 128, max_tokens: int = 32) -> dict:
    """Deterministic mode against the default (bench/deterministic.py, smaller): greedy
    probes alone and inside a burst, identical or not, and each mode's speed. Switches
    `model` to the batch-invariant steps for good: run it last."""
    from types import SimpleNamespace

    vocab = model.config.vocab_size
    args = SimpleNamespace(kv_gib=24, max_tokens=max_tokens)
    probe_prompts = prompts(vocab, probes, 512, seed=41)
    others = prompts(vocab, burst - probes, 512, seed=42)
    modes = [measure(model_dir, model, det, args, probe_prompts, others) for det in (False, True)]
    modes.append(measure(model_dir, model, True, args, probe_prompts, others, graphs=False))
    return {"prompt_len": 512, "max_tokens": max_tokens, "modes": modes, **compare_modes(modes)}


def run_all(
    out_dir: str,
    budget_s: float = 480.0,
    hf_compile: bool = True,
    only: set[str] | None = None,
    deterministic: bool = True,
    repeats: int = 1,
) -> dict:
    t_start = time.perf_counter()
    res: dict = {"env": environment(), "errors": {}}
    log = lambda msg: print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    def section(name, fn):
        """Run one benchmark; an error is recorded and the others still run."""
        try:
            fn()
        except Exception as exc:
            import traceback

            traceback.print_exc()
            res["errors"][name] = f"{type(exc).__name__}: {exc}"[:500]
        _dump(out_dir, res)

    def strip(r: dict) -> dict:
        return {k: v for k, v in r.items() if k != "tokens"}

    dev = torch.device("cuda")
    res["ceilings"] = ceil = measure_ceilings(dev)
    bw, rate = ceil["copy_bytes_per_s"], ceil["matmul_flops_per_s"]
    log(f"ceilings {json.dumps({k: f'{v:.4g}' for k, v in ceil.items()})}")
    model_dir, model = build()
    cfg = model.config
    cost = ModelCost(cfg)
    res["model"] = {
        "weight_bytes_read": cost.weight_bytes_read,
        "kv_bytes_per_token": cost.kv_bytes_per_token,
        "flops_per_token": 2 * cost.matmul_params,
    }
    log("model built")
    # Distinct prompts for every engine run (a repeated prompt would hit the prefix cache).
    cmp_prompts = prompts(cfg.vocab_size, 33, 512)  # [0]: batch 1, [1:]: batch 32; same for every system
    cmp_tokens = 64

    t = time.perf_counter()
    fast = new_engine(model_dir, model, "fast", kv_gib=40, swap_space_bytes=4 << 30)
    res["engine_start_s"] = time.perf_counter() - t  # the engine captures its decode graphs at start
    log(f"engine started with {len(fast.runner.fast_decode.graphs)} graphs in {res['engine_start_s']:.1f}s")

    def batch1():
        b1 = bench_engine_decode(fast, prompts(cfg.vocab_size, 1, 512, seed=20), 256)
        avg_ctx = 512 + 128
        bytes_per_token = cost.weight_bytes_read + avg_ctx * cost.kv_bytes_per_token
        b1["mbu"] = b1["decode_tok_s"] * bytes_per_token / bw
        replay = bench_graph_replay(fast, 1, avg_ctx)
        b1["graph_replay_s"] = replay
        b1["graph_mbu"] = bytes_per_token / replay / bw
        res["batch1_fast"] = strip(b1)
        fast.config = fast.config.replace(async_scheduling=False)
        try:
            b1s = bench_engine_decode(fast, prompts(cfg.vocab_size, 1, 512, seed=21), 256)
        finally:
            fast.config = fast.config.replace(async_scheduling=True)
        res["batch1_sync_steps"] = {
            "decode_tok_s": b1s["decode_tok_s"],
            "mbu": b1s["decode_tok_s"] * bytes_per_token / bw,
        }
        log(f"batch-1 without async scheduling: {b1s['decode_tok_s']:.1f} tok/s")
        log(
            f"batch-1 fast: {b1['decode_tok_s']:.1f} tok/s, MBU {b1['mbu']:.3f}; bare replay {replay * 1e3:.3f} ms "
            f"(MBU {b1['graph_mbu']:.3f})"
        )
        res["graph_replay_ms"] = {}
        for size in (1, 8, 32, 64, 128, 256):
            for ctx in (640, 4096):
                s = bench_graph_replay(fast, size, ctx)
                b, f = cost.step([(1, ctx)] * size)
                res["graph_replay_ms"][f"b{size}_ctx{ctx}"] = {
                    "ms": s * 1e3,
                    "roofline_ms": max(b / bw, f / rate) * 1e3,
                    "share": max(b / bw, f / rate) / s,
                }
        log(f"graph replays: {json.dumps(res['graph_replay_ms'])}")
        res["batch1_replay_ab_ms"] = batch1_replay_ab(fast, avg_ctx)
        log(
            f"batch-1 replay, fused GEMVs / cuBLAS, with and without PDL (ms): {json.dumps(res['batch1_replay_ab_ms'])}"
        )
        res["rows_replay_ab_ms"] = rows_replay_ab(fast, avg_ctx)
        log(f"2-64 row replays, fused row kernels / cuBLAS (ms): {json.dumps(res['rows_replay_ab_ms'])}")

    def compare_fast():
        # transformers' static-cache runs are timed after an identical untimed run (their
        # compile needs it); ours after an untimed run of the same shapes, kept as
        # cmp_fast_first_*. Ours take other prompts for every run but the timed first, so
        # nothing is a prefix hit; with repeats the median run is kept.
        for size, batch in ((1, cmp_prompts[:1]), (32, cmp_prompts[1:])):
            first = prompts(cfg.vocab_size, size, 512, seed=60 + size)
            res[f"cmp_fast_first_b{size}"] = strip(bench_engine_decode(fast, first, cmp_tokens))
            more = [prompts(cfg.vocab_size, size, 512, seed=70 + 10 * i + size) for i in range(repeats - 1)]
            runs = [strip(bench_engine_decode(fast, b, cmp_tokens)) for b in [batch, *more]]
            res[f"cmp_fast_b{size}"] = median_run(runs)
        log(
            f"fast: b1 {res['cmp_fast_b1']['tok_s']:.1f}, b32 {res['cmp_fast_b32']['tok_s']:.1f} tok/s; untimed first "
            f"runs {res['cmp_fast_first_b1']['tok_s']:.1f}, {res['cmp_fast_first_b32']['tok_s']:.1f}"
        )

    def throughput():
        many = prompts(cfg.vocab_size, 256, 512, seed=1)
        # Warm-up with the same shapes: Triton compiles the prefill path's kernel variants
        # on first use (about 2 s in the first such run); the timed run is steady state.
        t = time.perf_counter()
        run_requests(fast, prompts(cfg.vocab_size, 64, 512, seed=3), 8)
        res["throughput_warmup_s"] = time.perf_counter() - t
        steps = record_steps(fast)
        replays = fast.runner.fast_decode.num_replays
        try:
            r = run_requests(fast, many, 256)
        finally:
            unrecord_steps(fast)
        replays = fast.runner.fast_decode.num_replays - replays
        # the same workload again with a sync after each model call: where the time goes
        timings: list = []
        timed_steps = record_steps(fast, timings)
        try:
            r2 = run_requests(fast, prompts(cfg.vocab_size, 256, 512, seed=2), 256)
        finally:
            unrecord_steps(fast)
        # Async scheduling's effect: synchronous and async runs alternated (run order moved
        # single runs by up to 0.4 s), each split at the last request's first token.
        ab = []
        for i, async_on in enumerate((False, True, False, True)):
            fast.config = fast.config.replace(async_scheduling=async_on)
            try:
                ri = run_requests(fast, prompts(cfg.vocab_size, 256, 512, seed=10 + i), 256)
            finally:
                fast.config = fast.config.replace(async_scheduling=True)
            ab.append(
                {
                    "async_scheduling": async_on,
                    "seconds": ri["seconds"],
                    "tok_s": ri["output_tokens"] / ri["seconds"],
                    "until_last_first_token_s": ri["seconds"] - ri["decode_seconds"],
                    "after_last_first_token_s": ri["decode_seconds"],
                }
            )
        res["throughput_async_ab"] = ab
        log(f"throughput, synchronous and async steps alternated: {json.dumps(ab)}")
        decode_count = sum(1 for s in timed_steps if all(n == 1 for n, _ in s))
        res["throughput_split"] = {
            "seconds": r2["seconds"],
            **step_time_split(timings, r2["seconds"], len(timed_steps), decode_count),
        }
        bound = roofline_seconds(cost, steps, bw, rate)
        decode_steps = [s for s in steps if all(n == 1 for n, _ in s)]
        res["throughput"] = {
            "tok_s": r["output_tokens"] / r["seconds"],
            "seconds": r["seconds"],
            "steps": len(steps),
            "pure_decode_steps": len(decode_steps),
            "roofline_s": bound,
            "share_of_bound": bound / r["seconds"],
            "roofline_decode_s": roofline_seconds(cost, decode_steps, bw, rate),
            "decode_seconds_after_last_first_token": r["decode_seconds"],
            "graph_replays": replays,
            "mode_after": fast.runner.mode,
        }
        log(f"throughput: {json.dumps(res['throughput'])}")
        log(f"throughput split (synced re-run): {json.dumps(res['throughput_split'])}")

    def prefix():
        res["prefix"] = bench_prefix(fast, cfg.vocab_size)
        log(f"prefix: {json.dumps(res['prefix'])}")

    def swap():
        res["swap"] = bench_swap(fast, 1024)
        res["swap"]["share_of_pinned_out"] = res["swap"]["out_bytes_per_s"] / ceil["d2h_pinned_bytes_per_s"]
        res["swap"]["share_of_pinned_in"] = res["swap"]["in_bytes_per_s"] / ceil["h2d_pinned_bytes_per_s"]
        log(f"swap: {json.dumps(res['swap'])}")

    def profiles():
        profile_decode(fast, 1, 640, f"{out_dir}/profile_b1_ctx640.txt")
        profile_decode(fast, 256, 640, f"{out_dir}/profile_b256_ctx640.txt")
        profile_prefill(fast, cfg.vocab_size, f"{out_dir}/profile_prefill_16x512.txt")
        res["prefix_profile"] = profile_prefix(fast, cfg.vocab_size, f"{out_dir}/profile_prefix_warm.txt")

    for name, fn in (
        ("batch1", batch1),
        ("compare_fast", compare_fast),
        ("throughput", throughput),
        ("prefix", prefix),
        ("swap", swap),
        ("profiles", profiles),
    ):
        if only is None or name in only:
            section(name, fn)
    res["fastpath_failures"] = dict(fast.counters.fastpath_failures)
    if only is not None:
        if "deterministic" in only:
            fast = None  # the section closures hold it: drop it for the collector
            free_dropped_engines()
            section("deterministic", lambda: res.update(deterministic=bench_deterministic(model_dir, model)))
        _dump(out_dir, res)
        print_table(res)
        return res

    def fallback():
        slow = new_engine(model_dir, model, "fallback", kv_gib=16)
        res["cmp_fallback_b1"] = strip(bench_engine_decode(slow, cmp_prompts[:1], cmp_tokens))
        res["cmp_fallback_b32"] = strip(bench_engine_decode(slow, cmp_prompts[1:], cmp_tokens))
        log(f"fallback: b1 {res['cmp_fallback_b1']['tok_s']:.1f}, b32 {res['cmp_fallback_b32']['tok_s']:.1f} tok/s")

    section("fallback", fallback)
    torch.cuda.empty_cache()
    hf = hf_model_sharing_weights(model_dir, model)

    def hf_eager():
        res["cmp_hf_eager_b1"] = strip(bench_hf(hf, cmp_prompts[:1], cmp_tokens))
        res["cmp_hf_eager_b32"] = strip(bench_hf(hf, cmp_prompts[1:], cmp_tokens))
        log(f"hf eager: b1 {res['cmp_hf_eager_b1']['tok_s']:.1f}, b32 {res['cmp_hf_eager_b32']['tok_s']:.1f} tok/s")

    def hf_compiled():
        if time.perf_counter() - t_start > budget_s - 200:
            raise TimeoutError("skipped: under 200 s left in the device call")
        res["cmp_hf_static_compile_b1"] = strip(bench_hf(hf, cmp_prompts[:1], cmp_tokens, True, repeats))
        log(f"hf static+compile: b1 {res['cmp_hf_static_compile_b1']['tok_s']:.1f} tok/s")
        if time.perf_counter() - t_start > budget_s - 100:
            raise TimeoutError("batch 32 skipped: under 100 s left in the device call")
        res["cmp_hf_static_compile_b32"] = strip(bench_hf(hf, cmp_prompts[1:], cmp_tokens, True, repeats))
        log(f"hf static+compile: b32 {res['cmp_hf_static_compile_b32']['tok_s']:.1f} tok/s")

    section("hf_eager", hf_eager)
    if hf_compile:
        section("hf_compiled", hf_compiled)
    hf = None  # the closures above hold it: drop it for the collector
    if deterministic:
        fast = None
        free_dropped_engines()
        section("deterministic", lambda: res.update(deterministic=bench_deterministic(model_dir, model)))
    ratios = {}
    for key in list(res):
        if key.startswith("cmp_") and not key.startswith("cmp_fast_"):
            fast_key = "cmp_fast_b1" if key.endswith("_b1") else "cmp_fast_b32"
            if fast_key in res:
                ratios[key] = res[key]["tok_s"] / res[fast_key]["tok_s"]
    res["ratios_to_fast"] = ratios
    _dump(out_dir, res)
    print_table(res)
    return res


def _dump(out_dir: str, res: dict) -> None:
    with open(f"{out_dir}/results.json", "w") as f:
        json.dump(res, f, indent=2, default=str)


def print_table(res: dict) -> None:
    c = res["ceilings"]
    print(
        f"\ncopy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, matmul {c['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s, "
        f"pinned h2d {c['h2d_pinned_bytes_per_s'] / 1e9:.1f} GB/s, d2h {c['d2h_pinned_bytes_per_s'] / 1e9:.1f} GB/s"
    )
    if "batch1_fast" in res:
        b1 = res["batch1_fast"]
        print(
            f"batch-1 fast      {b1['decode_tok_s']:8.1f} tok/s  MBU {b1['mbu']:.3f} (bare graph {b1['graph_mbu']:.3f})"
        )
    if "throughput" in res:
        t = res["throughput"]
        print(
            f"throughput        {t['tok_s']:8.1f} tok/s  {t['share_of_bound']:.3f} of roofline "
            f"({t['roofline_s']:.2f}s of {t['seconds']:.2f}s)"
        )
    for k in ("cmp_fast_first_b1", "cmp_fast_first_b32", "cmp_fast_b1", "cmp_fast_b32"):
        if k in res:
            print(f"{k:26s}{res[k]['tok_s']:8.1f} tok/s")
    for k, ratio in res.get("ratios_to_fast", {}).items():
        print(f"{k:26s}{res[k]['tok_s']:8.1f} tok/s  {ratio:.3f}x fast")
    if "prefix" in res:
        p = res["prefix"]
        print(f"prefix TTFT cold {p['cold_s'] * 1e3:.1f} ms, warm {p['warm_s'] * 1e3:.1f} ms ({p['speedup']:.1f}x)")
        sweep = p.get("warm_by_new_tokens", {})
        for key in sweep:
            if key.endswith("_eager_ms"):
                n = key.removeprefix("new").removesuffix("_eager_ms")
                rows = sweep[f"new{n}_graph_rows_ms"]
                print(f"  warm, {n:>3} new tokens: graph rows {rows:6.1f} ms, eager {sweep[key]:6.1f} ms")
    det = res.get("deterministic", {})
    for m in det.get("modes", []):
        name = mode_name(m)
        print(
            f"{name:14s} probes identical {m['probes_identical']}/{m['probes']}, burst "
            f"{m['burst_output_tok_s']:.0f} tok/s, batch-1 {m['batch1_decode_tok_s']:.1f} tok/s"
        )
    if "probes_same_with_and_without_graphs" in det:
        print(
            f"deterministic probes alike with and without decode graphs: {det['probes_same_with_and_without_graphs']}"
        )
    if "swap" in res:
        s = res["swap"]
        print(
            f"swap out {s['out_bytes_per_s'] / 1e9:.1f} GB/s ({s['share_of_pinned_out']:.2f}), "
            f"in {s['in_bytes_per_s'] / 1e9:.1f} GB/s ({s['share_of_pinned_in']:.2f})"
        )
    if res.get("errors"):
        print("errors: " + json.dumps(res["errors"])[:1500])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="directory for results.json and the kernel profiles")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="seconds the whole run may take; the compiled transformers runs are skipped past it",
    )
    parser.add_argument("--no-hf-compile", action="store_true", help="skip transformers with static cache + compile")
    parser.add_argument(
        "--only",
        help="comma-separated sections to run (batch1, compare_fast, throughput, prefix, swap, "
        "profiles, deterministic); the fallback and transformers runs are then skipped",
    )
    parser.add_argument(
        "--no-deterministic", action="store_true", help="skip deterministic mode against the default (run last)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="time our engine and compiled transformers this many times each in the comparison and keep the "
        "median run (default 1)",
    )
    parser.add_argument(
        "--rows-configs",
        help="best_configs.json of a rows_sweep run: the 2-64 row kernels take those launch shapes",
    )


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        print(f"--repeats must be at least 1, got {args.repeats}")
        return 2
    if not torch.cuda.is_available():
        print("gpu-decode needs a CUDA GPU; none is visible here")
        return 2
    os.makedirs(args.out, exist_ok=True)  # before the run: its results are written section by section
    if args.rows_configs:
        print(f"row kernels: {load_measured_configs(args.rows_configs)} launch shapes from {args.rows_configs}")
    run_all(
        args.out,
        args.budget_s,
        hf_compile=not args.no_hf_compile,
        only=set(args.only.split(",")) if args.only else None,
        deterministic=not args.no_deterministic,
        repeats=args.repeats,
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
