"""SLO classes of `inferd bench serve`: who is promised what, and which request is whose.

A class has a share of the requests and up to three targets in seconds: time to first
token, time per output token after the first, end to end. A class with no target is
best effort. `--slo-class NAME:share=0.3,ttft=0.5,tpot=0.05[,e2e=30]` defines one;
`--goodput ttft:MS tpot:MS e2el:MS` (vllm bench serve's flag, milliseconds) sets the
targets of the single class `default` instead.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

NAME = re.compile(r"[A-Za-z0-9_.-]+")
SLO_KEYS = ("ttft", "tpot", "e2e")  # --slo-class, seconds
GOODPUT_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e"}  # --goodput (vLLM's names), milliseconds
SHARE_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class SloClass:
    name: str
    share: float
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValueError(f"class name must be letters, digits, '_', '.' or '-', got {self.name!r}")
        if not (isinstance(self.share, (int, float)) and 0.0 < self.share <= 1.0):
            raise ValueError(f"share of class {self.name!r} must be in (0, 1], got {self.share!r}")
        for key, value in self.targets.items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{key} target of class {self.name!r} must be a positive number, got {value!r}")

    @property
    def targets(self) -> dict[str, float]:
        """The targets set, seconds, by their --slo-class key."""
        values = {"ttft": self.ttft_s, "tpot": self.tpot_s, "e2e": self.e2e_s}
        return {k: v for k, v in values.items() if v is not None}

    @property
    def is_best_effort(self) -> bool:
        return not self.targets


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{what} must be a number, got {text!r}") from None


def parse_slo_class(text: str) -> SloClass:
    """`NAME:share=0.3,ttft=0.5,tpot=0.05,e2e=30` (seconds); `share` is required."""
    name, sep, rest = text.partition(":")
    if not sep or not rest:
        raise ValueError(f"expected NAME:share=S[,ttft=S][,tpot=S][,e2e=S], got {text!r}")
    fields: dict[str, float] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"expected KEY=VALUE in {text!r}, got {item!r}")
        if key not in ("share", *SLO_KEYS):
            raise ValueError(f"unknown key {key!r} in {text!r}; keys: share, {', '.join(SLO_KEYS)}")
        if key in fields:
            raise ValueError(f"{key} given twice in {text!r}")
        fields[key] = _number(value.strip(), key)
    if "share" not in fields:
        raise ValueError(f"class {name!r} needs a share (share=0.3)")
    return SloClass(name, fields["share"], fields.get("ttft"), fields.get("tpot"), fields.get("e2e"))


def parse_goodput(pairs: Iterable[str]) -> SloClass:
    """vllm bench serve's `--goodput ttft:MS tpot:MS e2el:MS` as the class `default`."""
    targets: dict[str, float] = {}
    for pair in pairs:
        key, sep, value = pair.partition(":")
        if not sep or key not in GOODPUT_KEYS:
            raise ValueError(f"expected KEY:MS with KEY one of {', '.join(GOODPUT_KEYS)}, got {pair!r}")
        ms = _number(value, key)
        if not ms > 0:
            raise ValueError(f"{key} target must be a positive number of milliseconds, got {value!r}")
        targets[GOODPUT_KEYS[key] + "_s"] = ms / 1e3
    return SloClass("default", 1.0, **targets)


def check_classes(classes: Sequence[SloClass]) -> None:
    """The classes cover every request once: distinct names, shares summing to 1."""
    if not classes:
        raise ValueError("no SLO class")
    names = [c.name for c in classes]
    if len(set(names)) != len(names):
        raise ValueError(f"class names must differ, got {', '.join(names)}")
    total = math.fsum(c.share for c in classes)
    if abs(total - 1.0) > SHARE_TOLERANCE:
        raise ValueError(
            f"shares must sum to 1, they sum to {total:g} ({', '.join(f'{c.name}={c.share:g}' for c in classes)})"
        )


def assign_classes(num_requests: int, classes: Sequence[SloClass], rng: random.Random) -> list[str]:
    """Each request's class: every class gets its share of `num_requests` (largest
    remainder rounding, so the counts sum to `num_requests`), in a seeded random order,
    so a short level still carries each class in proportion."""
    exact = [c.share * num_requests for c in classes]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(classes)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in by_remainder[: num_requests - sum(counts)]:
        counts[i] += 1
    names = [c.name for c, n in zip(classes, counts) for _ in range(n)]
    rng.shuffle(names)
    return names
