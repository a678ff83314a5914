"""Where the stack lives and how `up` runs it (`StackConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_RUN_DIR = REPO / ".out" / "stack"


@dataclass(frozen=True, slots=True)
class StackConfig:
    run_dir: Path
    timeout_s: float = 120.0
    agent_args: tuple[str, ...] = ()
    with_grafana: bool = True
    model: Path | None = None  # the engine's checkpoint; None = the agent runs without an engine

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout must be positive, got {self.timeout_s}")
