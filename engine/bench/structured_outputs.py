"""Step time with structured outputs: a decode batch where half the requests follow a
JSON schema (xgrammar bitmask per step, applied on the logits' device) against the same
batch with none, greedy and sampled.

    python -m inferd.engine.bench.structured_outputs --out DIR [--preset tiny] [--batch 32]

A random `make-model` checkpoint; every request gets its prompt and first token first,
then `--steps` decode steps are timed one by one (median and p90), with the mask work
(bitmask fill for the constrained rows and the matchers' advance) timed separately.
The constrained rows' schema has a long required string, so none of them finishes while
the steps are measured. Results in DIR/structured_outputs.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from ..llm import LLM
from ..model.make_model import ModelSpec, make_model
from ..request.sampling_params import SamplingParams
from ..structured_outputs.grammar import StructuredOutputs
from ..structured_outputs.params import StructuredOutputsParams

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 600},
        "kind": {"enum": ["a", "b", "c"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["title", "kind", "tags"],
    "additionalProperties": False,
}


class _MaskTimer:
    """Wraps StructuredOutputs.fill and .accept, adding up their wall time."""

    def __init__(self, structured: StructuredOutputs):
        self.seconds = 0.0
        for name in ("fill", "accept"):
            inner = getattr(structured, name)
            setattr(structured, name, self._timed(inner))

    def _timed(self, inner: Any) -> Any:
        def call(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args)
            finally:
                self.seconds += time.perf_counter() - start

        return call


def run_case(
    model_dir: str, device: str, batch: int, steps: int, constrained_share: float, temperature: float, dtype: str
) -> dict:
    llm = LLM(
        model_dir, device=device, dtype=dtype, max_num_seqs=batch, async_scheduling=False, kv_cache_bytes=256 << 20
    )
    engine = llm.engine
    timer = _MaskTimer(engine.structured)
    num_constrained = int(batch * constrained_share)
    for i in range(batch):
        so = StructuredOutputsParams(json=SCHEMA) if i < num_constrained else None
        params = SamplingParams(
            max_tokens=steps + 8, temperature=temperature, seed=i, ignore_eos=so is None, structured_outputs=so
        )
        engine.add_request(f"r{i}", f"Request {i}: write it down.", params)
    while (
        engine.structured.num_held
        or any(s.num_output_tokens == 0 for s in engine.scheduler.running)
        or (engine.scheduler.waiting)
    ):
        engine.step()  # grammar compile, prefill and first tokens: not timed
    times, mask_times = [], []
    for _ in range(steps):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        timer.seconds = 0.0
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
        mask_times.append(timer.seconds)
        if len(engine.scheduler.running) != batch:
            raise RuntimeError("a request finished while steps were measured; raise the schema's minLength")
    times.sort()
    return {
        "constrained": num_constrained,
        "batch": batch,
        "temperature": temperature,
        "step_ms_median": round(statistics.median(times) * 1e3, 3),
        "step_ms_p90": round(times[int(0.9 * (len(times) - 1))] * 1e3, 3),
        "mask_ms_median": round(statistics.median(mask_times) * 1e3, 3),
    }


def _commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="directory for structured_outputs.json")
    parser.add_argument(
        "--preset", default="tiny", help="make-model preset (default tiny: the mask's share is largest)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--dtype", default="auto", help="auto (the checkpoint's), float32, bfloat16 (the GPU fast path)"
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40)


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(make_model(Path(tmp) / "model", ModelSpec(preset=args.preset)))
        vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
        cases = [
            run_case(model_dir, args.device, args.batch, args.steps, share, temperature, args.dtype)
            for temperature in (0.0, 1.0)
            for share in (0.0, 0.5)
        ]
    for base, half in (cases[0:2], cases[2:4]):
        half["step_time_vs_none"] = round(half["step_ms_median"] / base["step_ms_median"], 3)
    result = {
        "benchmark": "structured_outputs_step_time",
        "date": time.strftime("%Y-%m-%d"),
        "commit": _commit(),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads",
        "device": args.device,
        "dtype": args.dtype,
        "versions": {
            "torch": torch.__version__,
            "xgrammar": metadata.version("xgrammar"),
            "python": platform.python_version(),
        },
        "model": {"preset": args.preset, "vocab_size": vocab},
        "schema": SCHEMA,
        "steps": args.steps,
        "cases": cases,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "structured_outputs.json").write_text(json.dumps(result, indent=2) + "\n")
    for case in cases:
        print(json.dumps(case))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
