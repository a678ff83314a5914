"""Overlapping the host with the GPU on decode steps (vLLM V1's async scheduling, in small).

A synchronous decode step leaves the GPU idle while the host turns the step's tokens
into outputs (append, detokenize, stop checks) and schedules the next step. Here,
once a decode step is running on the decode graphs, the engine launches
the step after it before it reads the first one's tokens: the next step's input ids
are the first step's tokens on the device, so nothing waits for the host. The host
then processes the first step's tokens while the GPU runs the second.

A continuation is launched only when the scheduler would have scheduled exactly that
batch, and the scheduler says so: AsyncScheduler.schedule_ahead (engine/scheduling/async_scheduler.py)
plans it, blocks included, or declines. A row's token is
chosen on the device right after the step (Sampler.draw_ahead: bias, min_tokens ban and
penalties from the slot's device state, whose counts take each drawn token there), so it
feeds the next step as a greedy one does; a seeded row's noise and a min_tokens ban are
keyed by its output position counting the tokens still in flight, so it draws what the
synchronous engine draws. The logprobs a row asks for are computed there
too, from the same raw logits, and come back with the tokens in the same copy
(sampling/token_readback.py). A sequence that turns out to
finish (a stop token) had one extra token computed: its row is dropped, and the K/V
it wrote lies past the sequence's end, in a block that is freed with it; any later
use of that block comes after it in stream order. A sequence that will finish by
length for certain is left out of the continuation.

Non-finite logits are found when a step's tokens are read (the flag travels with
them): the continuation launched from them is dropped, the engine switches to the
fallback path and runs the step again there, as the synchronous path does.

In: a scheduled batch (`launch`) or the step in flight (`launch_next`), with the
runner, the scheduler and the configuration's owner (engine/live_config.py) given at
construction. Out: an InflightStep (the batch, its PendingTokens, its stats), whose
tokens the engine reads in its next step. This module changes no sequence or block
state (the scheduler does) and does not know the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..fast_path.cuda_graphs import is_pure_decode
from ..memory.device_index import device_index
from ..sampling.greedy import can_launch_ahead, plain_greedy
from ..sampling.logprobs import LogprobLayout
from ..sampling.token_readback import PendingTokens, TokenReadback
from ..scheduling.scheduler_output import ScheduledSeq
from ..stats import StepStats, kv_tokens_read

if TYPE_CHECKING:
    import torch

    from ..live_config import LiveConfig
    from ..sampling.sampler import Sampler
    from ..scheduling.async_scheduler import AsyncScheduler
    from ..stats import EngineCounters
    from .runner_protocol import ModelRunnerProtocol


@dataclass(slots=True)
class InflightStep:
    """A launched decode step whose tokens the host has not read yet."""

    batch: list[ScheduledSeq]
    tokens: PendingTokens
    stats: StepStats


class AsyncDecode:
    """Launches decode steps ahead of the host (see the module doc). The engine
    owns the step in flight, reading its tokens, the rerun after a non-finite step and
    the output processing; this owns launching, with what it is given here."""

    def __init__(
        self,
        runner: ModelRunnerProtocol,
        scheduler: AsyncScheduler,
        config: LiveConfig,
        max_model_len: int,
        device: torch.device,
        counters: EngineCounters,
        sampler: Sampler,
    ):
        self.runner = runner
        self.sampler = sampler  # draws the sampled rows' tokens on the device
        self.scheduler = scheduler  # plans each continuation: its rows, their blocks
        self.config = config  # read at each launch: a run-time change may switch async scheduling
        self.max_model_len = max_model_len
        self.device = device
        self.counters = counters
        self._readback: TokenReadback | None = None

    def launch(self, batch: list[ScheduledSeq], stats: StepStats) -> InflightStep | None:
        """Start a scheduled decode batch on the graphs without waiting for its tokens."""
        runner = self.runner
        if (
            not self.config.current.async_scheduling
            or runner.fast_decode is None
            or not is_pure_decode(batch)
            or not all(can_launch_ahead(item.seq) for item in batch)
        ):
            return None
        draw, logprobs = self._draw(batch, 0)
        pending = runner.launch_greedy_decode(batch, self._token_readback(), draw=draw, logprobs=logprobs)
        return InflightStep(batch, pending, stats) if pending is not None else None

    def launch_next(self, prev: InflightStep) -> InflightStep | None:
        """Launch the step after `prev`, fed by prev's tokens on the device, when the
        scheduler plans exactly that batch (AsyncScheduler.schedule_ahead)."""
        if not self.config.current.async_scheduling:
            return None
        found = self.scheduler.schedule_ahead(prev.batch, self.max_model_len)
        if found is None:
            return None
        rows, index = found
        fed = prev.tokens.device_tokens
        if len(index) != len(prev.batch):
            fed = fed.index_select(0, device_index(index, self.device))
        stats = StepStats(len(rows), len(rows), kv_tokens_read=kv_tokens_read(rows))
        draw, logprobs = self._draw(rows, 1)
        pending = self.runner.launch_greedy_decode(
            rows, self._token_readback(), fed_ids=fed, draw=draw, logprobs=logprobs
        )
        if pending is None:
            return None
        self.counters.decode_steps_launched_ahead += 1
        return InflightStep(rows, pending, stats)

    def _draw(
        self, batch: list[ScheduledSeq], pending: int
    ) -> tuple[Callable[[torch.Tensor], torch.Tensor] | None, LogprobLayout | None]:
        """The step's draw from its logits on the device, and the layout of the logprobs
        it packs after its tokens. No draw when every row is plain greedy (the graph's
        greedy tokens are the answer); a greedy row asking for logprobs goes through the
        sampler, whose token is the same argmax of the raw logits."""
        seqs = [item.seq for item in batch]
        if all(plain_greedy(s, pending) for s in seqs):
            return None, None
        logprobs = LogprobLayout.of([s.params.logprobs for s in seqs])
        return (lambda logits: self.sampler.draw_ahead(logits, seqs, pending)), logprobs

    def _token_readback(self) -> TokenReadback:
        if self._readback is None:
            fast_decode = self.runner.fast_decode
            assert fast_decode is not None  # a step launches ahead only on the decode graphs
            self._readback = TokenReadback(self.device, fast_decode.max_batch)
        return self._readback
