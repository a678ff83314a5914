"""What every GPU benchmark shares: the device's ceilings, its environment, a random-weight
model of a preset built on the device, engines over it, prompts and a submit-and-step loop."""

from __future__ import annotations

import gc
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from ..fast_path.cuda_graphs import DecodeGraphs
from ..request.sampling_params import SamplingParams
from .random_model import make_engine, random_model_on_device, write_checkpoint_stub


# --- ceilings ------------------------------------------------------------------------------
def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_cuda(fn, repeat: int = 10, warmup: int = 3) -> float:
    """Median seconds of fn() measured with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def measure_ceilings(device: torch.device) -> dict:
    n = 1 << 30  # 2 GiB of bf16 per buffer
    bufs = [torch.randn(n, dtype=torch.bfloat16, device=device), torch.empty(n, dtype=torch.bfloat16, device=device)]
    copy_s = time_cuda(lambda: bufs[1].copy_(bufs[0]))
    mats = [torch.randn(8192, 8192, dtype=torch.bfloat16, device=device) for _ in range(2)]
    mm_s = time_cuda(lambda: mats[0] @ mats[1])
    bufs.clear()
    mats.clear()
    host = torch.randn(1 << 28, dtype=torch.bfloat16).pin_memory()  # 512 MiB
    dev = torch.empty_like(host, device=device)
    h2d_s = time_cuda(lambda: dev.copy_(host, non_blocking=True), repeat=5)
    d2h_s = time_cuda(lambda: host.copy_(dev, non_blocking=True), repeat=5)
    nbytes = host.numel() * 2
    return {
        "copy_bytes_per_s": 2 * n * 2 / copy_s,
        "matmul_flops_per_s": 2 * 8192**3 / mm_s,
        "h2d_pinned_bytes_per_s": nbytes / h2d_s,
        "d2h_pinned_bytes_per_s": nbytes / d2h_s,
    }


def environment() -> dict:
    import triton

    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        driver = f"nvidia-smi failed: {exc}"
    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:
        tf_version = None
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": torch.cuda.get_device_name(),
        "nvidia_smi": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "transformers": tf_version,
        "python": platform.python_version(),
    }


# --- engine set-up ---------------------------------------------------------------------------
def build(preset: str = "llama3-8b-shape", seed: int = 0, device: str = "cuda", dtype: str | None = None, **spec):
    """(checkpoint dir, model on `device`) for the preset, weights drawn on the device;
    `spec`: more ModelSpec fields (arch, tie_word_embeddings, overrides). device="cpu" (a
    tiny preset, float32) is the dry run of the scripts' Python code."""
    dtype = dtype or ("bfloat16" if device == "cuda" else "float32")
    model_dir = tempfile.mkdtemp(prefix="inferd-bench-")
    write_checkpoint_stub(model_dir, preset=preset, dtype=dtype, **spec)
    model = random_model_on_device(model_dir, getattr(torch, dtype), torch.device(device), seed=seed)
    return model_dir, model


def new_engine(model_dir, model, mode: str = "fast", kv_gib: float = 24, **config):
    device = model.embed_tokens.weight.device
    defaults = dict(
        dtype=str(model.embed_tokens.weight.dtype).removeprefix("torch."),
        device=device.type,
        mode=mode,
        kv_cache_bytes=int(kv_gib * (1 << 30)),
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        swap_space_bytes=0,
        max_model_len=40960,
    )
    engine = make_engine(model_dir, model, **{**defaults, **config})
    if device.type == "cpu":  # dry run: the fused decode without graphs (Triton's interpreter)
        from ..fast_path.fast_decoder import FastDecoder  # Triton kernels, under the interpreter set up first

        engine.runner.fast_decode = DecodeGraphs(
            FastDecoder(model, engine.runner.kv_layers),
            engine.config.block_size,
            engine.max_model_len,
            device,
            pages=engine.runner.pages,
            use_graphs=False,
        )
        engine.fast_path_unavailable = None
    for kv in engine.runner.kv_layers if hasattr(engine.runner, "kv_layers") else engine.kv_cache.layers:
        kv[0].normal_()  # never time on zeros (untouched blocks are read only by padded rows anyway)
        kv[1].normal_()
    gc.collect()
    gc.freeze()  # as the server does after start-up: no full collections over the engine's objects
    return engine


def free_dropped_engines() -> None:
    """Reclaim engines the caller has dropped: new_engine froze their objects, so their
    KV pools go only once the collector may see them again."""
    gc.unfreeze()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def prompts(vocab: int, num: int, length: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(5, vocab, (num, length), generator=gen).tolist()


def run_requests(engine, batch_prompts, max_tokens: int) -> dict:
    """Submit all at once, step to the end. Times: total, and decode-only (first token of
    the last request to the end)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    base = f"b{time.monotonic_ns()}-"
    sync()
    start = time.perf_counter()
    for i, p in enumerate(batch_prompts):
        engine.add_request(f"{base}{i}", p, params)
    first_tokens: dict[str, float] = {}
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            now = time.perf_counter()
            first_tokens.setdefault(out.request_id, now)
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
    end = time.perf_counter()
    assert all(len(t) == max_tokens for t in outputs.values()), "a request stopped early"
    all_first = max(first_tokens.values())
    return {
        "seconds": end - start,
        "decode_seconds": end - all_first,
        "output_tokens": len(batch_prompts) * max_tokens,
        "tokens": [outputs[f"{base}{i}"] for i in range(len(batch_prompts))],
    }


def load_measured_configs(path: str | Path) -> int:
    """Put a sweep's best launch shapes (rows_sweep.py's best_configs.json) into
    triton_rows.MEASURED_CONFIGS, as if measured in code; returns how many."""
    from ..fast_path.triton_rows import MEASURED_CONFIGS, RowsConfig  # Triton kernels

    rows = json.loads(Path(path).read_text())
    for r in rows:
        MEASURED_CONFIGS[r["n"], r["k"], r["block_m"]] = RowsConfig(
            r["block_n"], r["block_k"], r["num_warps"], r["num_stages"], r.get("split_k", 1)
        )
    return len(rows)
