"""`inferd bench burst`: the server against the offline engine, same requests, same run.

1. Offline: the engine in this process; N requests of exactly P random prompt tokens and
   O output tokens (greedy, ignore_eos) submitted at once and stepped to the end.
2. Server: `inferd serve` started as a subprocess with the same engine options (or
   --url), the same N requests sent at once to /v1/completions with token-id prompts,
   non-streaming and/or streaming, by a thin client (engine/bench/burst_client.py).

The model: --model DIR, or --preset (make_model's config and tokenizer; each side draws
the same random weights on its device, load_format dummy).

Per phase: output tokens/s over the burst's wall time (and its ratio to offline), TTFT
p50/p99 (offline: first token; streaming: first chunk carrying text), the time until
every request had its first token, end-to-end p50/p99, errors and requests whose token
count is not O, and the client's own CPU time. A small warm-up burst (other prompts,
a few output tokens) runs first on each side and is not counted.

Sampling (burst_sampling.py): with --temperature, --top-p, --top-k, --min-p, --seed-share,
--mix or --logprobs, each side also runs the burst with that sampling mix after its greedy burst,
and reports it against greedy ("x greedy": tok/s over the same side's greedy tok/s).

Prompts: one set drawn from --prompt-seed. The server runs its modes one after the
other, and its prefix cache would hand the second mode the first mode's prompt blocks;
so each phase's prompts differ in their first token (same lengths, same work, no shared
blocks between phases).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import random
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import EngineConfig
from .burst_client import BurstResult, completion_body, send_burst
from .burst_figures import PhaseFigures, offline_figures, print_table, server_figures
from .burst_offline import run_offline
from .burst_sampling import SamplingMix, greedy_params
from .random_model import write_checkpoint_stub
from .serve import start_server, stop_server

log = logging.getLogger(__name__)

STREAM_CHOICES = {"no": (False,), "yes": (True,), "both": (False, True)}
PRESETS = ("tiny", "small", "llama3-8b-shape")
FIRST_ID = 5  # prompt ids start here: below are the special tokens of make_model's tokenizers
URL_ONLY_VOCAB = 256  # prompt ids with --url and no model: [FIRST_ID, 256) is valid in any vocabulary


@dataclass(slots=True)
class BurstConfig:
    num_requests: int = 256
    prompt_len: int = 512
    output_len: int = 256
    stream: str = "both"
    prompt_seed: int = 0
    warmup_requests: int = 8
    warmup_output_len: int = 4
    request_timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        for name in ("num_requests", "prompt_len", "output_len", "warmup_output_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.stream not in STREAM_CHOICES:
            raise ValueError(f"stream must be one of {', '.join(STREAM_CHOICES)}; got {self.stream!r}")
        if not isinstance(self.warmup_requests, int) or self.warmup_requests < 0:
            raise ValueError(f"warmup_requests must be an integer >= 0, got {self.warmup_requests!r}")
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s!r}")

    @property
    def stream_modes(self) -> tuple[bool, ...]:
        return STREAM_CHOICES[self.stream]


def make_prompts(vocab_size: int, num: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(FIRST_ID, vocab_size) for _ in range(length)] for _ in range(num)]


def for_phase(prompts: list[list[int]], phase: int, vocab_size: int) -> list[list[int]]:
    """The prompts with a first token of this phase's own (see the module docstring)."""
    span = vocab_size - FIRST_ID
    return [[FIRST_ID + (p[0] - FIRST_ID + phase) % span, *p[1:]] for p in prompts]


# --- engine options: the same ones reach the offline engine and the started server ------
def _engine_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(EngineConfig) if f.name != "model"]


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "engine",
        "EngineConfig fields (engine/config.py), given to the offline "
        "engine and to the started server alike; unset ones keep their defaults",
    )
    for f in _engine_fields():
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            group.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=f"default {f.default!r}"
            )
        else:
            group.add_argument(flag, dest=f.name, type=type(f.default), default=None, help=f"default {f.default!r}")


def engine_options(args: argparse.Namespace) -> dict:
    return {f.name: getattr(args, f.name) for f in _engine_fields() if getattr(args, f.name, None) is not None}


def server_flags(options: dict) -> list[str]:
    """`inferd serve`'s spelling of the options (it takes every EngineConfig field)."""
    flags = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags


# --- the run ------------------------------------------------------------------------------
def _device(options: dict) -> str:
    import torch

    device = options.get("device", "auto")
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def _checkpoint_dtype(options: dict, device: str) -> str:
    dtype = options.get("dtype", "auto")
    if dtype != "auto":
        return dtype
    return "float32" if device == "cpu" else "bfloat16"


def _server_bursts(
    url: str,
    cfg: BurstConfig,
    prompts: dict[tuple[bool, bool], list[list[int]]],
    warmup: list[list[int]],
    mix: SamplingMix,
) -> dict[tuple[bool, bool], BurstResult]:
    """Results by (stream, sampled)."""
    import httpx

    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    kinds = (False, True) if mix.is_sampled else (False,)
    for stream in cfg.stream_modes:  # warm-up: every path the burst takes
        for sampled in kinds:
            if warmup:
                params = (mix.request_params if sampled else greedy_params)(len(warmup))
                bodies = [completion_body(model, p, cfg.warmup_output_len, stream, q) for p, q in zip(warmup, params)]
                send_burst(url, bodies, stream, cfg.request_timeout_s)
    results = {}
    for stream in cfg.stream_modes:
        for sampled in kinds:
            phase = prompts[stream, sampled]
            params = (mix.request_params if sampled else greedy_params)(len(phase))
            payloads = [completion_body(model, p, cfg.output_len, stream, q) for p, q in zip(phase, params)]
            results[stream, sampled] = result = send_burst(url, payloads, stream, cfg.request_timeout_s)
            log.info("server %s%s burst: %.1f s", "stream" if stream else "non-stream", _label(sampled), result.wall_s)
    return results


def _label(sampled: bool) -> str:
    return " sampled" if sampled else ""


def _git_commit() -> str | None:
    """HEAD of the checkout this code runs from ("-dirty" with tracked changes); None for a
    copy that is not a checkout itself (a copy inside another repository would report
    that repository's HEAD)."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != root:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_model() -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


def machine_and_versions() -> tuple[dict, dict]:
    import torch

    machine = {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "inferd_commit": _git_commit(),
    }
    return machine, versions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-requests", type=int, default=256, help="requests in the burst (default 256)")
    parser.add_argument("--prompt-len", type=int, default=512, help="prompt tokens per request (default 512)")
    parser.add_argument("--output-len", type=int, default=256, help="output tokens per request (default 256)")
    parser.add_argument(
        "--stream",
        choices=list(STREAM_CHOICES),
        default="both",
        help="server modes: non-streaming, streaming, or both (default both)",
    )
    parser.add_argument("--prompt-seed", type=int, default=0, help="seed of the random prompt ids (default 0)")
    parser.add_argument(
        "--warmup-requests", type=int, default=8, help="requests in each side's warm-up burst (default 8; 0: none)"
    )
    parser.add_argument("--warmup-output-len", type=int, default=4, help="output tokens per warm-up request")
    sampling = parser.add_argument_group(
        "sampling", "any of these adds a sampled burst on each side, reported against its greedy burst"
    )
    sampling.add_argument("--temperature", type=float, help="of the sampling requests (default 1.0)")
    sampling.add_argument("--top-p", type=float, default=1.0, help="of the sampling requests (default 1.0: off)")
    sampling.add_argument("--top-k", type=int, default=0, help="of the sampling requests (default 0: off)")
    sampling.add_argument("--min-p", type=float, default=0.0, help="of the sampling requests (default 0: off)")
    sampling.add_argument(
        "--seed-share", type=float, default=0.0, help="share of the sampling requests with a seed (default 0)"
    )
    sampling.add_argument(
        "--mix", type=float, default=1.0, help="share of the burst's requests that sample, the rest greedy (default 1)"
    )
    sampling.add_argument("--logprobs", type=int, help="top-N logprobs on every sampling request (default none)")
    parser.add_argument("--model", help="checkpoint directory for both sides")
    parser.add_argument(
        "--preset",
        choices=PRESETS,
        help="make-model shape with random weights drawn on the "
        "device by both sides (load_format dummy); default tiny, without --model or --url",
    )
    parser.add_argument(
        "--url",
        help="burst a running server instead of starting one; the offline phase "
        "then runs only with --model or --preset",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        help=f"prompt ids are drawn below this (default: the model's; {URL_ONLY_VOCAB} with --url alone)",
    )
    parser.add_argument("--skip-offline", action="store_true", help="server phases only (no ratio)")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra option for the started server only, e.g. --server-arg=--max-body-bytes=8388608",
    )
    parser.add_argument("--startup-timeout", type=float, default=900.0, help="seconds for the server to be ready")
    parser.add_argument("--request-timeout", type=float, default=1800.0, help="seconds per request")
    parser.add_argument("--out", default="bench-burst.json", help="JSON report (default ./bench-burst.json)")
    add_engine_arguments(parser)


def preset_checkpoint(out_dir: str, preset: str, options: dict) -> str:
    """make_model's directory for `preset` without its weights: both sides draw the same
    random ones on their device (load_format=dummy, one seed), so nothing is written or
    read for llama3-8b-shape's 16 GB."""
    return str(write_checkpoint_stub(out_dir, preset=preset, dtype=_checkpoint_dtype(options, _device(options))))


def run(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        cfg = BurstConfig(
            num_requests=args.num_requests,
            prompt_len=args.prompt_len,
            output_len=args.output_len,
            stream=args.stream,
            prompt_seed=args.prompt_seed,
            warmup_requests=args.warmup_requests,
            warmup_output_len=args.warmup_output_len,
            request_timeout_s=args.request_timeout,
        )
        mix = SamplingMix(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            seed_share=args.seed_share,
            mix=args.mix,
            logprobs=args.logprobs,
        )
        options = engine_options(args)
        EngineConfig.from_dict({"model": "", **options})  # a bad value fails here, before any checkpoint is written
        if args.model and args.preset:
            raise ValueError("give --model or --preset, not both")
        preset = args.preset or (None if args.model or args.url else "tiny")
        if preset and options.setdefault("load_format", "dummy") != "dummy":
            raise ValueError(
                "a --preset checkpoint has no weights on disk (load_format dummy); "
                "for load_format auto write one with `inferd make-model` and give --model"
            )
    except ValueError as exc:
        log.error("bad option: %s", exc)
        return 2
    tmp = tempfile.mkdtemp(prefix=f"inferd-burst-{preset}-") if preset else None
    try:
        model_dir = args.model
        if preset and tmp is not None:  # tmp is made exactly when there is a preset
            model_dir = preset_checkpoint(tmp, preset, options)
        vocab = args.vocab_size or (
            json.loads(Path(model_dir, "config.json").read_text())["vocab_size"] if model_dir else URL_ONLY_VOCAB
        )
        if options.get("max_num_seqs", 64) < cfg.num_requests:
            log.warning(
                "max_num_seqs (%s) < %d requests: part of the burst waits in both phases",
                options.get("max_num_seqs", 64),
                cfg.num_requests,
            )
        base = make_prompts(vocab, cfg.num_requests, cfg.prompt_len, cfg.prompt_seed)
        warmup = make_prompts(vocab, cfg.warmup_requests, cfg.prompt_len, cfg.prompt_seed + 1_000_003)
        phases: list[PhaseFigures] = []
        if model_dir and not args.skip_offline:
            sampled_burst = (
                (for_phase(base, 3, vocab), mix.request_params(cfg.num_requests)) if mix.is_sampled else None
            )
            greedy, sampled_result = run_offline(
                model_dir,
                options,
                for_phase(base, 0, vocab),
                cfg.output_len,
                warmup,
                cfg.warmup_output_len,
                sampled_burst,
            )
            phases.append(offline_figures(greedy, cfg.output_len))
            if sampled_result is not None:
                phases.append(offline_figures(sampled_result, cfg.output_len, phases[0].output_tok_s, " sampled"))
        offline_tok_s = phases[0].output_tok_s if phases else None
        # Phases 1, 2: greedy non-stream, stream; 4, 5: sampled (3: the offline sampled burst).
        prompts = {
            (stream, sampled): for_phase(base, 1 + stream + 3 * sampled, vocab)
            for stream in (False, True)
            for sampled in (False, True)
        }
        proc, url = None, args.url
        if url is None:
            proc, url = start_server(model_dir, [*server_flags(options), *args.server_arg], args.startup_timeout)
        try:
            bursts = _server_bursts(url.rstrip("/"), cfg, prompts, warmup, mix)
        finally:
            if proc is not None:
                stop_server(proc)
        for (stream, sampled), b in bursts.items():
            greedy_tok_s = server_figures(bursts[stream, False], stream, cfg.output_len, None).output_tok_s
            phases.append(
                server_figures(
                    b, stream, cfg.output_len, offline_tok_s, greedy_tok_s if sampled else None, _label(sampled)
                )
            )
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    machine, versions = machine_and_versions()
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine,
        "versions": versions,
        "options": {
            "burst": asdict(cfg),
            "sampling": asdict(mix) if mix.is_sampled else None,
            "engine": options,
            "model": args.model,
            "preset": preset,
            "url": args.url,
            "server_args": args.server_arg,
            "vocab_size": vocab,
        },
        "phases": [asdict(ph) for ph in phases],
    }
    print(
        f"burst: {cfg.num_requests} requests x {cfg.prompt_len} prompt x {cfg.output_len} output tokens, "
        f"{preset or args.model or args.url}"
    )
    print_table(phases)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 1 if any(ph.num_ok != ph.num_requests for ph in phases) else 0
