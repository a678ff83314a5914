"""KV storage: the device pool, the host swap pool, and the copies between them.

Layout: one tensor ``[2 (k, v), num_layers, num_blocks, block_size, num_kv_heads,
head_dim]`` per pool; each layer's K and V are views of it, so swapping a block moves
all its layers in one indexed copy. On CUDA the host pool is pinned and copies run
on their own stream; the compute stream waits on it before the next forward pass.
"""
from __future__ import annotations

import torch

from .numa_memory import empty_on_node


def block_bytes(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, num_host_blocks: int, block_size: int,
                 num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 host_numa_node: int | None):
        self.shape_tail = (block_size, num_kv_heads, head_dim)
        self.dtype = dtype
        self.device = device
        self.host_numa_node = host_numa_node
        self.block_bytes = block_bytes(num_layers, block_size, num_kv_heads, head_dim, dtype)
        self.device_kv = torch.zeros((2, num_layers, num_blocks, *self.shape_tail), dtype=dtype, device=device)
        self.host_kv = self._host_pool(num_host_blocks)
        self.copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def _host_pool(self, num_blocks: int) -> torch.Tensor:
        shape = (2, self.device_kv.shape[1], num_blocks, *self.shape_tail)
        return empty_on_node(shape, self.dtype, self.host_numa_node, pin=self.device.type == "cuda")

    @property
    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(self.device_kv[0, i], self.device_kv[1, i]) for i in range(self.device_kv.shape[1])]

    @property
    def num_blocks(self) -> int:
        return self.device_kv.shape[2]

    @property
    def num_host_blocks(self) -> int:
        return self.host_kv.shape[2]

    def swap(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """Copy out first (device->host), then in (host->device): a block freed by a
        swap-out may be the destination of a swap-in in the same step."""
        if not swap_out and not swap_in:
            return
        stream = self.copy_stream
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream) if stream is not None else _nullcontext():
            if swap_out:
                dev = torch.tensor([d for d, _ in swap_out], device=self.device)
                host = torch.tensor([h for _, h in swap_out])
                self.host_kv[:, :, host] = self.device_kv[:, :, dev].to("cpu", non_blocking=stream is not None)
            if swap_in:
                host = torch.tensor([h for h, _ in swap_in])
                dev = torch.tensor([d for _, d in swap_in], device=self.device)
                self.device_kv[:, :, dev] = self.host_kv[:, :, host].to(self.device, non_blocking=stream is not None)
        if stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            stream.synchronize()  # host blocks may be reused by the next scheduling pass

    def resize_host(self, num_blocks: int, keep: dict[int, int]) -> None:
        """New host pool of `num_blocks`; `keep` maps old host block -> new block to copy."""
        new = self._host_pool(num_blocks)
        if keep:
            old_ids = torch.tensor(list(keep))
            new_ids = torch.tensor(list(keep.values()))
            new[:, :, new_ids] = self.host_kv[:, :, old_ids]
        self.host_kv = new


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
