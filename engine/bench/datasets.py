"""What `inferd bench serve` sends: a prompt and an output length a request.

- a ShareGPT file (`--dataset PATH`, a JSON list or JSONL of
  `{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}`):
  the prompt is the first human turn, the output length the token length of the first
  gpt reply after it, as `vllm bench serve --dataset-name sharegpt` does; entries are
  taken in a seeded random order and repeated when the run needs more than the file has.
- `synthetic` (the default): ShareGPT-like lognormal lengths (parameters below), prompts
  of random words sized to the drawn token count.
- `uniform`: prompt lengths uniform in a range of words and one output length for all
  (the sweep this tool ran before it had datasets).

ShareGPT and synthetic requests are filtered as vLLM filters ShareGPT: a prompt or an
output under 4 tokens, a prompt over 1,024, or a prompt and output over the model's
context is skipped. Token counts come from an async `count(text, add_special_tokens)`
(token_count.py: the server's /tokenize, or an estimate).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

CountTokens = Callable[[str, bool], Awaitable[int]]

DATASETS = ("synthetic", "uniform")  # anything else is a path
MIN_LEN = 4
MAX_PROMPT_LEN = 1024
HUMAN, GPT = ("human", "user"), ("gpt", "assistant", "chatgpt")

# Lognormal lengths: median x exp(sigma x N(0, 1)), in tokens. The medians are fitted so
# that after the filter above (context 2,048) the means are those of the ShareGPT sample
# vLLM publishes for `vllm bench serve` (1,000 prompts, a Llama 3.1 tokenizer: 229,711
# prompt and 203,068 output tokens, so 230 and 203 a request). The sigmas are chosen,
# not fitted (no per-request lengths were at hand): prompts spread wider than replies
# (one-line questions beside pasted code and documents), so the kept prompts have a
# median near 153 and a p99 near 940, the replies a median near 138 and a p99 near 1,050.
PROMPT_MEDIAN, PROMPT_SIGMA = 169.0, 1.2
OUTPUT_MEDIAN, OUTPUT_SIGMA = 139.0, 0.9

WORDS = (
    "the engine keeps key value cache blocks sequence table batch step token memory host device "
    "scheduler prefix swap page fault model layer node socket link"
).split()
BATCH = 64  # token counts in flight at once


@dataclass(frozen=True, slots=True)
class SampleRequest:
    prompt: str
    prompt_len: int
    output_len: int


def fits(prompt_len: int, output_len: int, max_model_len: int) -> bool:
    return (
        prompt_len >= MIN_LEN
        and output_len >= MIN_LEN
        and prompt_len <= MAX_PROMPT_LEN
        and prompt_len + output_len <= max_model_len
    )


def _first_exchange(entry: object) -> tuple[str, str] | None:
    """The first human turn and the first gpt turn after it, or None."""
    turns = entry.get("conversations") if isinstance(entry, dict) else None
    if not isinstance(turns, list):
        return None
    prompt = None
    for turn in turns:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            continue
        if prompt is None and turn.get("from") in HUMAN:
            prompt = turn["value"]
        elif prompt is not None and turn.get("from") in GPT:
            return prompt, turn["value"]
    return None


def parse_sharegpt(text: str, source: str = "dataset") -> list[tuple[str, str]]:
    """(prompt, reply) pairs of a ShareGPT JSON list or JSONL text, in file order."""
    stripped = text.lstrip()
    try:
        if stripped.startswith("["):
            entries = json.loads(stripped)
        else:
            entries = [json.loads(line) for line in stripped.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: neither a JSON list nor JSON lines ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(entries, list):
        raise ValueError(f"{source}: expected a list of conversations")
    pairs = [p for p in map(_first_exchange, entries) if p is not None]
    if not pairs:
        raise ValueError(f"{source}: no entry has a human turn followed by a gpt reply")
    return pairs


def read_sharegpt(path: str | Path) -> list[tuple[str, str]]:
    return parse_sharegpt(Path(path).read_text(encoding="utf-8"), str(path))


def words_prompt(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, num_words)))


def synthetic_lengths(rng: random.Random) -> tuple[int, int]:
    prompt = round(PROMPT_MEDIAN * math.exp(PROMPT_SIGMA * rng.gauss(0.0, 1.0)))
    output = round(OUTPUT_MEDIAN * math.exp(OUTPUT_SIGMA * rng.gauss(0.0, 1.0)))
    return prompt, output


async def sized_prompt(
    prompt_len: int, count: CountTokens, tokens_per_word: float, rng: random.Random
) -> tuple[str, int]:
    """Random words for about `prompt_len` tokens, and their measured count."""
    prompt = words_prompt(rng, round(prompt_len / tokens_per_word))
    return prompt, await count(prompt, True)


async def sharegpt_requests(
    pairs: list[tuple[str, str]], num: int, count: CountTokens, rng: random.Random, max_model_len: int
) -> list[SampleRequest]:
    order = list(range(len(pairs)))
    rng.shuffle(order)
    kept: list[SampleRequest] = []
    for start in range(0, len(order), BATCH):
        if len(kept) >= num:
            break
        batch = [pairs[i] for i in order[start : start + BATCH]]
        prompt_lens = await asyncio.gather(*(count(p, True) for p, _ in batch))
        output_lens = await asyncio.gather(*(count(r, False) for _, r in batch))
        kept += [
            SampleRequest(p, pl, ol)
            for (p, _), pl, ol in zip(batch, prompt_lens, output_lens)
            if fits(pl, ol, max_model_len)
        ]
    if not kept:
        raise ValueError(
            f"no entry fits: prompt and reply of at least {MIN_LEN} tokens, a prompt of at most "
            f"{MAX_PROMPT_LEN}, both within the model's {max_model_len}"
        )
    return [kept[i % len(kept)] for i in range(num)]


async def synthetic_requests(
    num: int, count: CountTokens, tokens_per_word: float, rng: random.Random, max_model_len: int
) -> list[SampleRequest]:
    out: list[SampleRequest] = []
    for _ in range(100 * num // BATCH + 100):  # the filter keeps about 9 in 10 draws
        if len(out) >= num:
            return out[:num]
        drawn = [lengths for lengths in (synthetic_lengths(rng) for _ in range(BATCH)) if fits(*lengths, max_model_len)]
        prompts = [words_prompt(rng, round(p / tokens_per_word)) for p, _ in drawn]
        lens = await asyncio.gather(*(count(text, True) for text in prompts))
        out += [SampleRequest(text, n, o) for text, n, (_, o) in zip(prompts, lens, drawn) if fits(n, o, max_model_len)]
    raise ValueError(f"synthetic lengths do not fit a context of {max_model_len} tokens")


async def uniform_requests(
    num: int, words: tuple[int, int], output_len: int, count: CountTokens, rng: random.Random
) -> list[SampleRequest]:
    prompts = [words_prompt(rng, rng.randint(*words)) for _ in range(num)]
    lens: list[int] = []
    for start in range(0, num, BATCH):
        lens += await asyncio.gather(*(count(p, True) for p in prompts[start : start + BATCH]))
    return [SampleRequest(p, n, output_len) for p, n in zip(prompts, lens)]
