"""`inferd generate`: run prompts through the engine offline and print the completions."""
from __future__ import annotations

import json


def add_arguments(parser) -> None:
    parser.add_argument("prompts", nargs="+", help="prompt texts")
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--json", action="store_true", help="print one JSON object per prompt")


def run(args) -> int:
    from engine import LLM, SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    llm = LLM(args.model)
    for prompt, out in zip(args.prompts, llm.generate(args.prompts, params)):
        c = out.outputs[0]
        if args.json:
            print(json.dumps({"prompt": prompt, "text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason}))
        else:
            print(f"{prompt!r} -> {c.text!r} ({c.finish_reason})")
    return 0
