"""Index lists to the device without waiting for the GPU.

A copy from pageable host memory waits for the work already queued on the stream; one
from pinned memory is queued like a kernel, so the host can keep preparing the next step.
PyTorch's pinned-memory allocator holds the host block until the copy has run: callers
need not keep it alive.
"""

from __future__ import annotations

import torch


def device_index(values: list[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """`values` as an int64 tensor on `device` (a list becomes a 1-D tensor)."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.long)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
