"""The burst's sampling mix: which requests sample and with what (`--temperature`,
`--top-p`, `--top-k`, `--min-p`, `--seed-share`, `--mix`, `--logprobs`). With any of them given, each
side runs the burst greedy and then with the mix, in the same run, and reports the
sampled phases' tok/s against its own greedy phase.

`mix` is the share of requests that sample (the rest are greedy), spread evenly over the
burst; `seed_share` the share of the sampling requests that carry a seed (their index).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def _spread(index: int, share: float) -> bool:
    """Is item `index` one of the `share` of items, spread evenly (Bresenham)?"""
    return int((index + 1) * share) > int(index * share)


@dataclass(slots=True)
class SamplingMix:
    temperature: float | None = None  # None: 1.0 when any other field asks for sampling
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed_share: float = 0.0
    mix: float = 1.0
    logprobs: int | None = None  # top-N logprobs asked by the sampling requests

    def __post_init__(self) -> None:
        if self.temperature is not None and not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}")
        for name in ("min_p", "seed_share", "mix"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        if self.logprobs is not None and not (isinstance(self.logprobs, int) and 0 <= self.logprobs <= 20):
            raise ValueError(f"logprobs must be an integer in [0, 20], got {self.logprobs!r}")

    @property
    def is_sampled(self) -> bool:
        """Does the burst have a sampled phase at all?"""
        return self.mix > 0 and (
            self.temperature is not None
            or self.top_p < 1.0
            or self.top_k > 0
            or self.min_p > 0.0
            or self.seed_share > 0.0
            or self.mix < 1.0
            or self.logprobs is not None
        )

    def request_params(self, num_requests: int) -> list[dict[str, Any]]:
        """Per request, the API's sampling fields (SamplingParams takes the same names)."""
        sampled = {
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
        }
        out: list[dict[str, Any]] = []
        num_sampled = 0
        for i in range(num_requests):
            if not _spread(i, self.mix):
                out.append({"temperature": 0.0})
                continue
            params = dict(sampled)
            if self.logprobs is not None:
                params["logprobs"] = self.logprobs
            if _spread(num_sampled, self.seed_share):
                params["seed"] = i
            num_sampled += 1
            out.append(params)
        return out


GREEDY = [{"temperature": 0.0}]


def greedy_params(num_requests: int) -> list[dict[str, Any]]:
    return GREEDY * num_requests
