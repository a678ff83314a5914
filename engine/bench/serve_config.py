"""The configuration of one `inferd bench serve` run, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from .arrivals import ARRIVALS
from .burst_sampling import SamplingMix
from .slo_classes import SloClass, check_classes

DEFAULT_RATES = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
DEFAULT_MAX_MODEL_LEN = 2048  # vLLM's ShareGPT filter's total when the server does not say
UNIFORM_MAX_TOKENS = 64


@dataclass(slots=True)
class BenchConfig:
    rates: list[float] | None  # None: a trace replayed at its own timing, one level
    duration_s: float = 20.0
    dataset: str = "synthetic"  # synthetic, uniform or a ShareGPT file
    prompt_len_min: int = 16  # uniform: prompt words
    prompt_len_max: int = 256
    max_tokens: int | None = None  # uniform: every request's output (default 64); else a cap
    max_model_len: int | None = None  # None: the server's, else DEFAULT_MAX_MODEL_LEN
    seed: int = 0
    timeout_s: float = 300.0
    arrival: str = "poisson"
    burstiness: float = 1.0
    trace: str | None = None
    classes: list[SloClass] = field(default_factory=lambda: [SloClass("default", 1.0)])
    send_slo_class: bool = False
    sampling: SamplingMix = field(default_factory=SamplingMix)

    def __post_init__(self) -> None:
        if self.rates is None:
            if self.arrival != "trace":
                raise ValueError("rates are needed unless a trace sets the arrivals")
        else:
            if not self.rates or any(not (isinstance(r, (int, float)) and r > 0) for r in self.rates):
                raise ValueError(f"rates must be positive numbers, got {self.rates!r}")
            if sorted(self.rates) != list(self.rates):
                raise ValueError(f"rates must rise, got {self.rates!r}")
        if not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s!r}")
        if not 1 <= self.prompt_len_min <= self.prompt_len_max:
            raise ValueError(
                f"need 1 <= prompt_len_min <= prompt_len_max, got {self.prompt_len_min}, {self.prompt_len_max}"
            )
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ValueError(f"max_tokens must be >= 2 (inter-token latency needs two tokens), got {self.max_tokens}")
        if self.max_model_len is not None and self.max_model_len < 8:
            raise ValueError(f"max_model_len must be >= 8, got {self.max_model_len}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, got {self.arrival!r}")
        if (self.arrival == "trace") != (self.trace is not None):
            raise ValueError("a trace file goes with arrival 'trace', and only with it")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")
        check_classes(self.classes)

    @property
    def uniform_output_len(self) -> int:
        return UNIFORM_MAX_TOKENS if self.max_tokens is None else self.max_tokens
