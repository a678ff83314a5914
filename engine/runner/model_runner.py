"""Runs the model on one scheduled batch: inputs, attention metadata, forward, logits.

In: the scheduler's batch (ScheduledSeq: a sequence and how many of its tokens to
compute now). Out: a RunnerOutput (engine/runner/runner_output.py), all the engine reads of
the step: the logits of the rows that sample and, on the fast decode path, the greedy
tokens already read back with the finiteness check, or that check still on the
device for the sampler. `launch_greedy_decode` is the form that does not wait: its
tokens come back later as PendingTokens (async scheduling, engine/runner/async_decode.py).
What the engine uses of a runner is ModelRunnerProtocol (engine/runner/runner_protocol.py).

Fast and fallback paths: the fast path is whatever accelerated attention the device
offers (Triton kernels on CUDA, see engine/fast_path); the fallback is the portable
torch path. The mode is the engine's configuration's, read at each step through
`current_mode` (its owner's reader: engine/live_config.py). A fault on the
fast path (a non-finite logit, an injected failure, a CUDA error: engine/runner/fastpath_faults.py)
is reported to the engine (`on_fastpath_failure`), which counts the reason and switches to
the fallback until the mode is set back. A bug in our own launch code (a ValueError from a
kernel's argument checks, say) is reported to `on_fastpath_bug` instead and does not switch:
only that step leaves the fast path. Either way the step is run again on the portable path:
writing K/V is idempotent (same slots, same values), so no request sees the failure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..fast_path.cold_layout import cold_prefix_layout
from ..fast_path.gpu_sampling import can_sample_greedy_on_device
from ..kv.block_manager import token_slots
from ..kv.block_pool import PageAllocator
from ..kv.kv_cache import KVCache
from ..model.attention import AttentionMetadata, paged_attention
from ..model.model import LlamaModel
from ..request.prompt_logprobs import PromptLogprobRows
from ..request.prompt_logprobs import plan_rows as plan_prompt_rows
from ..request.prompt_logprobs import score as score_prompt_rows
from ..scheduling.scheduler import ScheduledSeq
from .fastpath_faults import is_launch_bug, is_strict
from .runner_output import RunnerOutput

if TYPE_CHECKING:
    from ..fast_path.cuda_graphs import DecodeGraphs
    from ..sampling.logprobs import LogprobLayout
    from ..sampling.token_readback import PendingTokens, TokenReadback
    from .batch_invariant_graphs import InvariantDecodeGraphs

log = logging.getLogger(__name__)


def _split_prompt_rows(
    logits: torch.Tensor, num_sample_rows: int, plan: PromptLogprobRows | None, batch_size: int
) -> RunnerOutput:
    if plan is None:
        return RunnerOutput(logits)
    sampled = logits[:num_sample_rows] if num_sample_rows else logits.new_zeros(0, 0)
    return RunnerOutput(sampled, prompt_logprobs=score_prompt_rows(logits[num_sample_rows:], plan, batch_size))


class FastPathError(RuntimeError):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class ModelRunner:
    """One device's runner (a ModelRunnerProtocol). `current_mode` reads the mode
    ("fast" or "fallback") from its one owner, the engine's LiveConfig: the runner
    never sets it, it reports leaving the fast path to `on_fastpath_failure`."""

    def __init__(
        self,
        model: LlamaModel,
        kv_cache: KVCache,
        block_size: int,
        current_mode: Callable[[], str],
        fast_attention: Callable[..., torch.Tensor] | None = None,
        pages: PageAllocator | None = None,
    ):
        self.model = model
        self.kv_cache = kv_cache
        self.pages = pages  # locates cold blocks (kind, page, slot); None when every block is hot
        # Pure-decode batches and short prefill steps on the fast path (engine/fast_path
        # DecodeGraphs: fused decode step in CUDA graphs); set by attach_fast_path on
        # CUDA, else None.
        self.fast_decode: DecodeGraphs | None = None
        # Deterministic mode's decode steps in CUDA graphs (engine/runner/batch_invariant_graphs.py);
        # set by attach_invariant_decode on CUDA, else None.
        self.invariant_decode: InvariantDecodeGraphs | None = None
        self.refresh_kv_views()
        self.block_size = block_size
        self.device = kv_cache.device
        self._current_mode = current_mode
        # Without an accelerated kernel the fast path is the portable one, still guarded,
        # so the switching logic is the same everywhere (and testable on CPU).
        self.fast_attention = fast_attention or paged_attention
        self.on_fastpath_failure: Callable[[str], None] = lambda reason: None
        self.on_fastpath_bug: Callable[[str], None] = lambda reason: None
        self._logged_launch_bugs: set[str] = set()
        self._injected_failure: str | None = None

    def refresh_kv_views(self) -> None:
        """Per-layer (k, v, cold) views of the arena; call again after cold KV is enabled."""
        self.kv_layers = [self.kv_cache.layer_views(i) for i in range(self.model.config.num_hidden_layers)]
        fast_decode = self.fast_decode
        if fast_decode is not None:
            fast_decode.decoder.set_kv_layers(self.kv_layers)
            if fast_decode.graphs:  # a cold kind switched on at run time: its graphs now, not mid-decode
                try:
                    fast_decode.capture_all()
                except Exception as exc:  # the decode step itself will fall back if it fails again
                    log.warning("capturing decode graphs for a new cold kind failed: %s", exc)

    @property
    def mode(self) -> str:
        return self._current_mode()

    def inject_fastpath_failure(self, reason: str) -> None:
        """Make the next fast-path step fail with `reason` (fault injection for tests)."""
        self._injected_failure = reason

    def _raise_injected_failure(self) -> None:
        """Fail this fast-path step if a failure was injected (once)."""
        if self._injected_failure is not None:
            reason, self._injected_failure = self._injected_failure, None
            raise FastPathError("injected", f"injected fast-path failure: {reason}")

    def prepare(self, batch: list[ScheduledSeq]) -> tuple[torch.Tensor, AttentionMetadata, list[int]]:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        sample_rows: list[int] = []
        for item in batch:
            seq, n = item.seq, item.num_tokens
            start = seq.num_computed_tokens
            query_start.append(len(input_ids))
            query_lens.append(n)
            context_lens.append(start + n)
            input_ids.extend(seq.tokens(start, start + n))
            positions.extend(range(start, start + n))
            slots.extend(token_slots(seq.block_table, bs, start, start + n))
            if item.completes:
                sample_rows.append(len(input_ids) - 1)
        # int32 tables padded to a multiple of 16 entries: the Triton kernels then see the
        # same argument types and alignments as in the captured decode graphs, and reuse
        # their compiled variants instead of compiling new ones mid-serving.
        max_blocks = -(-max(len(item.seq.block_table) for item in batch) // 16) * 16
        tables = torch.zeros(len(batch), max_blocks, dtype=torch.long)
        kinds = slots_in_page = None
        num_pages = self.kv_cache.num_blocks
        for i, item in enumerate(batch):
            tables[i, : len(item.seq.block_table)] = torch.tensor(item.seq.block_table, dtype=torch.long)
        cold_prefix = None
        if self.pages is not None and bool((tables >= num_pages).any()):
            kind_codes, page_ids, slot_ids = self.pages.locate_table(tables.numpy())
            tables = torch.from_numpy(page_ids)
            kinds = torch.from_numpy(kind_codes)
            slots_in_page = torch.from_numpy(slot_ids)
            cold_prefix = cold_prefix_layout(kind_codes)
        dev = self.device
        meta = AttentionMetadata(
            query_start=query_start,
            query_lens=query_lens,
            context_lens=torch.tensor(context_lens, device=dev),
            block_tables=tables.to(dev, torch.int32),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            max_query_len=max(query_lens),
            max_context_len=max(context_lens),
            sliding_window=self.model.config.sliding_window,
            block_kinds=kinds.to(dev) if kinds is not None else None,
            block_slots=slots_in_page.to(dev) if slots_in_page is not None else None,
            cold_prefix_blocks=torch.from_numpy(cold_prefix[0]).to(dev) if cold_prefix else None,
            cold_prefix_kind=cold_prefix[1] if cold_prefix else 0,
        )
        return torch.tensor(input_ids, dtype=torch.long, device=dev), meta, sample_rows

    def non_finite_after_all(self) -> None:
        """The sampler found the deferred check false: switch to the fallback path (the
        caller runs the step again, which rewrites the same K/V slots)."""
        self._switch_to_fallback(FastPathError("non_finite_logits", "non-finite logits on the fast path"))

    @torch.inference_mode()
    def execute(self, batch: list[ScheduledSeq]) -> RunnerOutput:
        """Run the batch: logits [num sampling sequences, vocab] in float32, in batch
        order, and on the fast decode path its greedy tokens or its finiteness check."""
        fast = self.mode == "fast"
        if fast and self.invariant_decode is not None and self.invariant_decode.can_run(batch):
            try:
                return RunnerOutput(self._invariant_decode_checked(batch))
            except Exception as exc:  # the eager step computes the same rows
                self._leave_fast_path(exc)
                fast = False
        if fast and self.fast_decode is not None and self.fast_decode.can_run(batch):
            try:
                output = self._fast_decode_checked(batch)
                if output is not None:  # None: a cold-block layout the graphs do not take
                    return output
            except Exception as exc:  # same switch as below; the portable step rewrites the K/V
                self._leave_fast_path(exc)
                fast = False
        return self._forward_batch(batch, fast)

    # The failures of the fast attention that switching to the portable path recovers from:
    # any, on one device (keep serving).
    fast_path_errors: tuple[type[Exception], ...] = (Exception,)

    def _forward_batch(self, batch: list[ScheduledSeq], fast: bool) -> RunnerOutput:
        """The batch through the model's forward: with the fast attention when `fast` and it
        takes this KV layout, else, or after a fast-path failure (_leave_fast_path), with
        the portable one."""
        input_ids, meta, sample_rows = self.prepare(batch)
        # Rows scoring prompt tokens (engine/request/prompt_logprobs.py) get their logits in the same
        # call as the sampling rows, after them.
        plan = plan_prompt_rows(batch, meta.query_start)
        rows = sample_rows + plan.rows if plan is not None else sample_rows
        has_cold = self.kv_layers[0][2] is not None
        fast_handles_batch = not has_cold or getattr(self.fast_attention, "supports_cold_kv", False)
        if fast and fast_handles_batch:
            try:
                logits = self._forward(input_ids, meta, rows, self._fast_attention_checked, check=True)
                return _split_prompt_rows(logits, len(sample_rows), plan, len(batch))
            except self.fast_path_errors as exc:
                self._leave_fast_path(exc)
        logits = self._forward(input_ids, meta, rows, paged_attention, check=False)
        return _split_prompt_rows(logits, len(sample_rows), plan, len(batch))

    @torch.inference_mode()
    def launch_greedy_decode(
        self,
        batch: list[ScheduledSeq],
        readback: TokenReadback,
        fed_ids: torch.Tensor | None = None,
        draw: Callable[[torch.Tensor], torch.Tensor] | None = None,
        logprobs: LogprobLayout | None = None,
    ) -> PendingTokens | None:
        """Start a greedy decode step on the decode graphs and return its tokens, still
        on their way to the host (async scheduling, engine/runner/async_decode.py). `fed_ids`:
        the rows' input tokens on the device, when the host has not read them yet. `draw`:
        the rows' tokens from the step's logits, on the device, when some row samples or
        asks for logprobs (else the graph's greedy tokens), followed by the logprobs that
        `logprobs` lays out (sampling/logprobs.py). None
        when the step cannot run this way (nothing was launched then); a fast-path
        failure is handled as in `execute` (_leave_fast_path)."""
        if self.mode != "fast" or self.fast_decode is None or not self.fast_decode.fits(batch):
            return None
        try:
            self._raise_injected_failure()
            logits = self.fast_decode.execute(batch, fed_ids=fed_ids)
            if logits is None:
                return None
            packed = self.fast_decode.greedy(len(batch))  # [finite flag, greedy tokens]
            if draw is not None:
                packed = torch.cat([packed[:1], draw(logits)])
            return readback.start(packed, logprobs)
        except Exception as exc:
            self._leave_fast_path(exc)
            return None

    def _fast_decode_checked(self, batch: list[ScheduledSeq]) -> RunnerOutput | None:
        self._raise_injected_failure()
        assert self.fast_decode is not None  # execute calls this only with decode graphs attached
        logits = self.fast_decode.execute(batch)
        if logits is None:
            return None
        sampling = [item.seq for item in batch if item.completes]
        packed = self.fast_decode.greedy(len(sampling))  # computed in the step's graph
        if can_sample_greedy_on_device(logits, sampling):
            # The step's one host synchronisation: the finiteness flag and the greedy
            # tokens come back in a single transfer.
            ok, *tokens = packed.tolist()
            if not ok:
                raise FastPathError("non_finite_logits", "non-finite logits on the fast path")
            return RunnerOutput(logits, sampled_token_ids=tokens)
        return RunnerOutput(logits, finite=packed[0])  # the sampler reads it with its tokens

    def _invariant_decode_checked(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        self._raise_injected_failure()
        assert self.invariant_decode is not None  # execute calls this only with the graphs attached
        logits = self.invariant_decode.execute(batch)
        if not torch.isfinite(logits).all():
            raise FastPathError("non_finite_logits", "non-finite logits in a deterministic decode graph")
        return logits

    def _leave_fast_path(self, exc: Exception) -> None:
        """A fast-path step raised `exc`; the caller reruns the step on the portable path.
        A fault switches the engine to the fallback; a bug in our launch code is logged
        with its traceback and counted, and the next step tries the fast path again
        (engine/runner/fastpath_faults.py). Strict (tests): anything but a FastPathError propagates."""
        if is_strict() and not isinstance(exc, FastPathError):
            raise exc
        if is_launch_bug(exc):
            kind = type(exc).__name__
            # A bug that hits every step would write a traceback every step: the first of
            # each kind carries it, the rest are one line (all are counted).
            first = kind not in self._logged_launch_bugs
            self._logged_launch_bugs.add(kind)
            log.error("fast-path launch bug (%s: %s); this step runs on the portable path", kind, exc, exc_info=first)
            self.on_fastpath_bug(type(exc).__name__)
            return
        self._switch_to_fallback(exc)

    def _switch_to_fallback(self, exc: Exception) -> None:
        reason = exc.reason if isinstance(exc, FastPathError) else type(exc).__name__
        log.error("fast path failed (%s: %s); switching to fallback", reason, exc)
        self.on_fastpath_failure(str(reason))  # the engine sets its mode to fallback

    def _fast_attention_checked(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self._raise_injected_failure()
        return self.fast_attention(*args, **kwargs)

    def _forward(
        self,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        sample_rows: list[int],
        attention_fn: Callable[..., torch.Tensor],
        check: bool,
    ) -> torch.Tensor:
        decoder = self.fast_decode.decoder if check and self.fast_decode is not None else None
        if decoder is not None:  # fast path on a device with the fused ops: prefill and mixed steps too
            hidden = decoder.forward_step(input_ids, meta, attention_fn)
        else:
            hidden = self.model(input_ids, meta, self.kv_layers, attention_fn)
        logits = self.model.compute_logits(hidden[sample_rows]) if sample_rows else hidden.new_zeros(0, 0)
        if check and logits.numel() and not torch.isfinite(logits).all():
            raise FastPathError("non_finite_logits", "non-finite logits on the fast path")
        return logits
