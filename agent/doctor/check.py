"""A check: an id, the layer it reads, and a function from the gathered inputs and the
thresholds to its findings. Each check module defines ``CHECK``; `CHECK_MODULES` lists
them in the order they run."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from .findings import LAYERS, Finding
from .inputs import Inputs
from .thresholds import Thresholds

CHECK_MODULES = (
    "inferd.agent.doctor.placement",
    "inferd.agent.doctor.pcie",
    "inferd.agent.doctor.copy_bandwidth",
    "inferd.agent.doctor.gpu_health",
    "inferd.agent.doctor.engine",
    "inferd.agent.doctor.kv_cache",
    "inferd.agent.doctor.saturation",
    "inferd.agent.doctor.configuration",
)


@dataclass(frozen=True, slots=True)
class Check:
    id: str
    layer: str
    description: str
    run: Callable[[Inputs, Thresholds], list[Finding]]
    active_only: bool = False  # loads the GPU and host: runs only with --active

    def __post_init__(self) -> None:
        if not self.id.isidentifier() or self.id != self.id.lower():
            raise ValueError(f"check id {self.id!r} must be a lower-case identifier")
        if self.layer not in LAYERS:
            raise ValueError(f"check {self.id!r}: layer must be one of {LAYERS}, got {self.layer!r}")


def load_checks() -> list[Check]:
    checks = [importlib.import_module(name).CHECK for name in CHECK_MODULES]
    ids = [c.id for c in checks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"check ids repeat: {ids}")
    return checks
