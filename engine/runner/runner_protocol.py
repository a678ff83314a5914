"""What the engine and AsyncDecode use of a model runner, said once.

ModelRunner (one device) and TPRunner (rank 0 of a tensor-parallel group) both
implement it; the engine holds its runner as this type and probes nothing else. A step
is plain data: scheduled sequences in, a RunnerOutput out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from ..fast_path.cuda_graphs import DecodeGraphs
    from ..sampling.logprobs import LogprobLayout
    from ..sampling.token_readback import PendingTokens, TokenReadback
    from ..scheduling.scheduler_output import ScheduledSeq
    from .runner_output import RunnerOutput


@runtime_checkable
class ModelRunnerProtocol(Protocol):
    device: torch.device
    # The decode graphs (fused decode step, CUDA graphs) when the fast path attached
    # them, else None: async decode launches only through them.
    fast_decode: DecodeGraphs | None
    # Called with the reason when the runner leaves the fast path (an exception, a
    # non-finite logit, an injected failure); the engine counts it and switches its mode.
    on_fastpath_failure: Callable[[str], None]
    # Called with the exception's type name when a step met a bug in the fast path's own
    # launch code (engine/runner/fastpath_faults.py): that step ran portable, the mode stays.
    on_fastpath_bug: Callable[[str], None]

    @property
    def mode(self) -> str:
        """The engine's mode ("fast" or "fallback"), read from its configuration."""
        ...

    def execute(self, batch: list[ScheduledSeq]) -> RunnerOutput:
        """Run one scheduled batch (a fast-path failure reruns it on the portable path)."""
        ...

    def launch_greedy_decode(
        self,
        batch: list[ScheduledSeq],
        readback: TokenReadback,
        fed_ids: torch.Tensor | None = None,
        draw: Callable[[torch.Tensor], torch.Tensor] | None = None,
        logprobs: LogprobLayout | None = None,
    ) -> PendingTokens | None:
        """Start a decode step on the decode graphs without waiting for its tokens (the
        greedy ones, or `draw`'s from its logits, followed by the logprobs `logprobs` lays
        out); None when it cannot run that way (nothing was launched then)."""
        ...

    def non_finite_after_all(self) -> None:
        """The deferred finiteness check failed: leave the fast path (the caller reruns the step)."""
        ...

    def inject_fastpath_failure(self, reason: str) -> None:
        """Make the next fast-path step fail (fault injection: tests and the admin API)."""
        ...

    def refresh_kv_views(self) -> None:
        """Take up the KV cache's views again (after a cold kind was enabled)."""
        ...
