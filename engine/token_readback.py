"""A decode step's tokens on their way from the device to the host.

A greedy decode step launched ahead of the host (engine/async_decode.py) leaves its
answer on the device: the finiteness flag and the greedy tokens, packed by the step's
graph (fast_path/greedy_head.py). TokenReadback starts the copy to pinned host memory
without waiting; PendingTokens is the step's handle on that copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class TokenReadback:
    """A step's tokens and finiteness flag, computed on the device, with their copy to
    pinned host memory under way. Two host buffers alternate: at most two steps are
    in flight, and a buffer is reused only after the step that used it was read."""

    def __init__(self, device: torch.device, max_rows: int):
        pin = device.type == "cuda"
        self._buffers = [torch.zeros(max_rows + 1, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self._turn = 0
        self.device = device

    def start(self, packed: torch.Tensor) -> PendingTokens:
        """Copy a step's packed answer ([1 + rows] int64 on the device: the finiteness
        flag, then the tokens; greedy_head.py) to the host, without waiting."""
        host = self._buffers[self._turn][: packed.numel()]
        self._turn ^= 1
        host.copy_(packed, non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return PendingTokens(packed[1:], host, event)


@dataclass(slots=True)
class PendingTokens:
    device_tokens: torch.Tensor  # [rows] int64, feeds the next step's input ids
    host: torch.Tensor  # [1 + rows]: the finiteness flag, then the tokens (filled asynchronously)
    event: torch.cuda.Event | None  # recorded after the copy; None on CPU (copy done)

    def synchronize(self) -> None:
        """Wait until the step, and every copy enqueued before it, has finished."""
        if self.event is not None:
            self.event.synchronize()

    def wait(self) -> tuple[list[int], bool]:
        self.synchronize()
        finite, *tokens = self.host.tolist()
        return tokens, bool(finite)
