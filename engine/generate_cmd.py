"""`inferd generate`: run prompts through the engine offline and print the completions.

A --model that is not a checkpoint, or options the engine refuses, end in one line
on stderr and exit status 2 (as `inferd serve` does), not a traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .llm import LLM
from .request.sampling_params import SamplingParams


def add_arguments(parser) -> None:
    parser.add_argument("prompts", nargs="+", help="prompt texts")
    parser.add_argument("--model", required=True, help="checkpoint directory (Hugging Face format)")
    parser.add_argument("--max-tokens", type=int, default=32, help="new tokens per prompt")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--seed", type=int, help="sampling seed (default: none, a random one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per prompt")


def model_dir_problem(model: str) -> str | None:
    path = Path(model)
    if not path.exists():
        return f"{model} does not exist"
    if not path.is_dir():
        return f"{model} is not a directory"
    if not (path / "config.json").is_file():
        return f"{model} has no config.json; give a Hugging Face checkpoint directory"
    return None


def run(args) -> int:
    def fail(message: str) -> int:
        print(f"inferd generate: {message}", file=sys.stderr)
        return 2

    problem = model_dir_problem(args.model)
    if problem:
        return fail(f"--model {problem}")
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
        llm = LLM(args.model)
        outputs = llm.generate(args.prompts, params)
    except (ValueError, OSError) as exc:  # a bad option, an unreadable or incomplete checkpoint
        return fail(str(exc))
    except KeyError as exc:  # config.json without a field the model needs
        return fail(f"{Path(args.model) / 'config.json'} lacks {exc}")
    for prompt, out in zip(args.prompts, outputs):
        c = out.outputs[0]
        if args.json:
            print(
                json.dumps(
                    {"prompt": prompt, "text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason}
                )
            )
        else:
            print(f"{prompt!r} -> {c.text!r} ({c.finish_reason})")
    return 0
