"""A decode step's tokens on their way from the device to the host.

A decode step launched ahead of the host (engine/runner/async_decode.py) leaves its answer on
the device, packed in one int64 tensor: the finiteness flag and the greedy tokens from
the step's graph (fast_path/greedy_head.py), or the sampler's tokens in their place
(Sampler.draw_ahead), followed by the logprobs of the rows asking for them
(sampling/logprobs.py). TokenReadback starts the copy to pinned host memory without
waiting; PendingTokens is the step's handle on that copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .logprobs import LogprobLayout


class TokenReadback:
    """A step's tokens, finiteness flag and logprobs, computed on the device, with their
    copy to pinned host memory under way. Two host buffers alternate: at most two steps
    are in flight, and a buffer is reused only after the step that used it was read."""

    def __init__(self, device: torch.device, max_rows: int):
        self._pin = device.type == "cuda"
        self._buffers = [self._allocate(max_rows + 1) for _ in range(2)]  # tokens only: logprobs grow them
        self._turn = 0
        self.device = device

    def start(self, packed: torch.Tensor, logprobs: LogprobLayout | None = None) -> PendingTokens:
        """Copy a step's packed answer ([1 + rows (+ logprobs.size)] int64 on the device:
        the finiteness flag, the tokens, then the rows' logprobs laid out by `logprobs`)
        to the host, without waiting."""
        size = packed.numel()
        if self._buffers[self._turn].numel() < size:
            # This buffer's last step has been read (the alternation), so it may go; the
            # pinned allocator keeps its block until any copy into it has run.
            self._buffers[self._turn] = self._allocate(max(size, 2 * self._buffers[self._turn].numel()))
        host = self._buffers[self._turn][:size]
        self._turn ^= 1
        host.copy_(packed, non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        num_rows = size - 1 - (logprobs.size if logprobs is not None else 0)
        return PendingTokens(packed[1 : 1 + num_rows], host, event, logprobs)

    def _allocate(self, size: int) -> torch.Tensor:
        return torch.zeros(size, dtype=torch.long, pin_memory=self._pin)


@dataclass(slots=True)
class PendingTokens:
    device_tokens: torch.Tensor  # [rows] int64, feeds the next step's input ids
    host: torch.Tensor  # the packed answer (TokenReadback.start), filled asynchronously
    event: torch.cuda.Event | None  # recorded after the copy; None on CPU (copy done)
    logprobs: LogprobLayout | None = None  # where the rows' logprobs lie after the tokens

    def synchronize(self) -> None:
        """Wait until the step, and every copy enqueued before it, has finished."""
        if self.event is not None:
            self.event.synchronize()

    def wait(self) -> tuple[list[int], bool, list[dict[int, float] | None]]:
        """The tokens, the finiteness flag and each row's logprobs (`unpack_answer`)."""
        self.synchronize()
        return unpack_answer(self.host, self.device_tokens.shape[0], self.logprobs)


def unpack_answer(
    host: torch.Tensor, num_rows: int, logprobs: LogprobLayout | None
) -> tuple[list[int], bool, list[dict[int, float] | None]]:
    """A step's packed answer, on the host ([1 + rows (+ logprobs.size)] int64: the
    finiteness flag, the tokens, then the rows' logprobs laid out by `logprobs`), as the
    tokens, the flag and each row's logprobs as Sampler.sample gives them: None for a row
    that asks for none, and for every row when the logits were not finite (those tokens
    are not used). The synchronous sampler reads its answer here too."""
    flag, *tokens = host[: 1 + num_rows].tolist()
    if logprobs is None or not flag:
        return tokens, bool(flag), [None] * num_rows
    return tokens, True, logprobs.unpack(tokens, host[1 + num_rows :])
