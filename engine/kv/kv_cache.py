"""KV storage: the device pool, the host swap pool, quantization and the copies between.

Layout. Memory is an arena of equal pages, ``uint8 [num_pages, page_bytes]``, one page
per hot block: viewed as ``[num_pages, 2 (k, v), num_layers, block_size, num_kv_heads,
head_dim]`` in the model's dtype, so a block holds all layers and one page copy moves
it whole. A page can instead hold `slots_per_page` cold blocks of one kind:
- int8: ``[slots, 2, layers, block_size, kv_heads, head_dim]`` int8, scales
  ``[pages, slots, 2, layers, kv_heads]`` float32 (one per block and kv head);
- int4: ``[slots, 2, layers, block_size, kv_heads, head_dim / 2]`` packed nibbles,
  scales ``[pages, slots, 2, layers, block_size, kv_heads, head_dim / group]`` float16.
The scale tables live beside the arena, one per cold kind in use; the kind the engine
starts with is paid for out of the same budget, one switched on at run time is
allocated beside it (and logged). The host pool has the same format, so swapping
moves cold blocks in their compact form. On CUDA the host pool is pinned and copies
run on their own stream, which the compute stream waits on before the next forward.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import torch

from ..memory.device_index import device_index
from ..memory.numa_memory import empty_on_node
from .block_pool import HOT, MAX_SLOTS, BlockCopy, BlockLocation
from .kv_quant import dequantize_int4, dequantize_int8, int4_group_size, quantize_int4, quantize_int8

log = logging.getLogger(__name__)

COLD_KINDS = ("int8", "int4")
QUANTIZE_CHUNK = 64  # blocks per quantization batch: 256 MiB of float32 for the 8B shape


@dataclass(frozen=True, slots=True)
class KVShape:
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def elt(self) -> int:
        return torch.tensor([], dtype=self.dtype).element_size()

    @property
    def page_bytes(self) -> int:
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * self.elt

    @property
    def tokens_elems(self) -> int:
        """Values of one block: 2 x layers x block_size x kv_heads x head_dim."""
        return self.page_bytes // self.elt

    def slots_per_page(self) -> dict[str, int]:
        return {"int8": min(MAX_SLOTS, self.elt), "int4": min(MAX_SLOTS, 2 * self.elt)}

    def scale_bytes_per_page(self, kind: str) -> int:
        slots = self.slots_per_page()[kind]
        if kind == "int8":
            return slots * 2 * self.num_layers * self.num_kv_heads * 4
        groups = self.head_dim // int4_group_size(self.head_dim)
        return slots * 2 * self.num_layers * self.block_size * self.num_kv_heads * groups * 2

    def cold_block_bytes(self, kind: str) -> int:
        """Bytes one cold block of `kind` occupies, its scales included."""
        return (
            self.page_bytes // self.slots_per_page()[kind]
            + self.scale_bytes_per_page(kind) // self.slots_per_page()[kind]
        )


def block_bytes(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    return KVShape(num_layers, block_size, num_kv_heads, head_dim, dtype).page_bytes


class _Arena:
    """One pool of pages (device or host) with its typed views."""

    def __init__(
        self,
        shape: KVShape,
        num_pages: int,
        device: torch.device,
        numa_node: int | None,
        cold_kinds: tuple[str, ...] = (),
    ):
        self.shape = shape
        self.num_pages = num_pages
        self.device = device
        s = shape
        if device.type == "cpu":
            self.bytes = empty_on_node((num_pages, s.page_bytes), torch.uint8, numa_node, pin=torch.cuda.is_available())
        else:
            self.bytes = torch.zeros((num_pages, s.page_bytes), dtype=torch.uint8, device=device)
        self.hot = self.bytes.view(s.dtype).view(num_pages, 2, s.num_layers, s.block_size, s.num_kv_heads, s.head_dim)
        slots = s.slots_per_page()
        # Cold slots are stored head-major (a block's tokens of one head are adjacent: 16 x
        # 128 B = 2 KiB for int8 at head_dim 128, one contiguous read for the decode kernel)
        # and viewed token-major like the hot pages, [.., block_size, kv_heads, ..]; every
        # reader goes through the views' strides.
        tail = (2, s.num_layers, s.num_kv_heads, s.block_size)
        self.slot_bytes = {"int8": s.tokens_elems, "int4": s.tokens_elems // 2}
        self.int8 = (
            self.bytes[:, : slots["int8"] * self.slot_bytes["int8"]]
            .view(torch.int8)
            .view(num_pages, slots["int8"], *tail, s.head_dim)
            .transpose(4, 5)
        )
        self.int4 = (
            self.bytes[:, : slots["int4"] * self.slot_bytes["int4"]]
            .view(num_pages, slots["int4"], *tail, s.head_dim // 2)
            .transpose(4, 5)
        )
        self.scales8: torch.Tensor | None = None
        self.scales4: torch.Tensor | None = None
        for kind in cold_kinds:
            self.add_scales(kind)

    def add_scales(self, kind: str) -> None:
        self.set_scales(kind, self.new_scales(kind))

    def new_scales(self, kind: str) -> torch.Tensor | None:
        """A zeroed scale table for `kind`, not yet attached (None when it has one)."""
        s, slots = self.shape, self.shape.slots_per_page()
        if kind == "int8" and self.scales8 is None:
            return torch.zeros(
                (self.num_pages, slots["int8"], 2, s.num_layers, s.num_kv_heads),
                dtype=torch.float32,
                device=self.device,
            )
        if kind == "int4" and self.scales4 is None:
            groups = s.head_dim // int4_group_size(s.head_dim)
            return torch.zeros(
                (self.num_pages, slots["int4"], 2, s.num_layers, s.num_kv_heads, s.block_size, groups),
                dtype=torch.float16,
                device=self.device,
            ).transpose(4, 5)  # head-major, as the codes
        return None

    def set_scales(self, kind: str, table: torch.Tensor | None) -> None:
        if table is None:
            return
        if kind == "int8":
            self.scales8 = table
        else:
            self.scales4 = table

    def has_kind(self, kind: str) -> bool:
        return (self.scales8 if kind == "int8" else self.scales4) is not None

    @property
    def has_scales(self) -> bool:
        return self.scales8 is not None or self.scales4 is not None


@dataclass(slots=True)
class ColdLayer:
    """One layer's cold views, for attention to dequantize on the fly."""

    int8_k: torch.Tensor
    int8_v: torch.Tensor
    scales8_k: torch.Tensor | None
    scales8_v: torch.Tensor | None
    int4_k: torch.Tensor
    int4_v: torch.Tensor
    scales4_k: torch.Tensor | None
    scales4_v: torch.Tensor | None

    def gather(
        self,
        which: int,
        kind: torch.Tensor,
        page: torch.Tensor,
        slot: torch.Tensor,
        hot: torch.Tensor,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """Blocks of [B, nb] entries, hot ones from `hot` ([B, nb, bs, kvh, hd]) and cold
        ones dequantized; returns [B, nb, bs, kvh, hd]."""
        out = hot
        data8, sc8, data4, sc4 = (
            (self.int8_k, self.scales8_k, self.int4_k, self.scales4_k)
            if which == 0
            else (self.int8_v, self.scales8_v, self.int4_v, self.scales4_v)
        )

        def mask(code: int) -> torch.Tensor:
            return (kind == code)[..., None, None, None]

        # Every entry is read through every view and the wrong kinds masked out after;
        # slots are clamped so an int4 page's slot 7 stays inside the int8 view.
        if bool((kind == 1).any()):
            assert sc8 is not None  # int8 blocks exist only once the int8 scale tables do
            s8 = slot.clamp(max=data8.shape[1] - 1)
            out = torch.where(mask(1), dequantize_int8(data8[page, s8], sc8[page, s8], dtype), out)
        if bool((kind == 2).any()):
            assert sc4 is not None
            s4 = slot.clamp(max=data4.shape[1] - 1)
            out = torch.where(mask(2), dequantize_int4(data4[page, s4], sc4[page, s4], dtype), out)
        return out


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        num_host_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        host_numa_node: int | None,
        cold_kinds: tuple[str, ...] = (),
    ):
        self.shape = KVShape(num_layers, block_size, num_kv_heads, head_dim, dtype)
        self.dtype = dtype
        self.device = device
        self.host_numa_node = host_numa_node
        self.block_bytes = self.shape.page_bytes
        self.device_pool = _Arena(self.shape, num_blocks, device, host_numa_node, cold_kinds)
        self.host_pool = _Arena(self.shape, num_host_blocks, torch.device("cpu"), host_numa_node, cold_kinds)
        self.copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.swap_delay_per_block_s = 0.0  # fault injection: a slow or degraded host link

    @property
    def num_blocks(self) -> int:
        return self.device_pool.num_pages

    @property
    def num_host_blocks(self) -> int:
        return self.host_pool.num_pages

    def has_kind(self, kind: str) -> bool:
        return self.device_pool.has_kind(kind)

    def enable_kind(self, kind: str) -> None:
        """Allocate a cold kind's scale tables at run time (beside the budget). Both pools'
        tables are allocated before either is attached: a failed allocation changes nothing."""
        if not self.has_kind(kind):
            extra = self.shape.scale_bytes_per_page(kind) * (self.num_blocks + self.num_host_blocks)
            device_table, host_table = self.device_pool.new_scales(kind), self.host_pool.new_scales(kind)
            self.device_pool.set_scales(kind, device_table)
            self.host_pool.set_scales(kind, host_table)
            log.info(
                "cold KV %s switched on at run time: %.1f MiB of scale tables beside the KV budget", kind, extra / 2**20
            )

    def layer_views(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, ColdLayer | None]:
        d = self.device_pool
        k, v = d.hot[:, 0, layer], d.hot[:, 1, layer]
        if not d.has_scales:
            return k, v, None

        def scales(t: torch.Tensor | None, which: int) -> torch.Tensor | None:
            return None if t is None else t[:, :, which, layer]

        cold = ColdLayer(
            d.int8[:, :, 0, layer],
            d.int8[:, :, 1, layer],
            scales(d.scales8, 0),
            scales(d.scales8, 1),
            d.int4[:, :, 0, layer],
            d.int4[:, :, 1, layer],
            scales(d.scales4, 0),
            scales(d.scales4, 1),
        )
        return k, v, cold

    # --- quantization ---------------------------------------------------------
    def quantize(self, pairs: list[tuple[int, BlockLocation]]) -> None:
        """pairs: (hot page, (kind, cold page, slot)). Reads each hot block once, in chunks
        of QUANTIZE_CHUNK blocks (a long prefill cools thousands at once: their float32
        copies would not fit beside a full pool). Enqueued without waiting for the GPU:
        indices travel through pinned memory."""
        d = self.device_pool
        for kind in COLD_KINDS:
            sel = [(h, p, s) for h, (k, p, s) in pairs if k == kind]
            for start in range(0, len(sel), QUANTIZE_CHUNK):
                chunk = sel[start : start + QUANTIZE_CHUNK]
                hot_ids, pages, slots = device_index(torch.tensor(chunk, dtype=torch.long).T.contiguous(), self.device)
                hot = d.hot[hot_ids]
                if kind == "int8":
                    assert d.scales8 is not None  # the block manager hands out int8 blocks only then
                    q, scale = quantize_int8(hot)
                    d.int8[pages, slots] = q
                    d.scales8[pages, slots] = scale
                else:
                    assert d.scales4 is not None
                    q, scale = quantize_int4(hot)
                    d.int4[pages, slots] = q
                    d.scales4[pages, slots] = scale

    # --- swap -------------------------------------------------------------------
    def swap(self, swap_out: list[BlockCopy], swap_in: list[BlockCopy]) -> None:
        """Each pair is ((kind, page, slot) source, (kind, page, slot) destination). Copies
        out first (device->host), then in: a page freed by a swap-out may be the
        destination of a swap-in in the same step."""
        if not swap_out and not swap_in:
            return
        stream = self.copy_stream
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx:
            self._copy(self.device_pool, self.host_pool, swap_out, stream is not None)
            self._copy(self.host_pool, self.device_pool, swap_in, stream is not None)
        if stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            stream.synchronize()  # host pages may be reused by the next scheduling pass
        if self.swap_delay_per_block_s:
            time.sleep(self.swap_delay_per_block_s * (len(swap_out) + len(swap_in)))

    def inject_slow_swap(self, seconds_per_block: float) -> None:
        """Make every swapped block cost `seconds_per_block` more (0: off), as a PCIe link
        trained down to a few lanes or a lower generation would (fault injection)."""
        if isinstance(seconds_per_block, bool) or not 0 <= seconds_per_block <= 1:
            raise ValueError(f"seconds_per_block must be in [0, 1], got {seconds_per_block!r}")
        self.swap_delay_per_block_s = float(seconds_per_block)

    @staticmethod
    def _copy(
        src: _Arena, dst: _Arena, pairs: list[BlockCopy], non_blocking: bool, per_block: bool | None = None
    ) -> None:
        if per_block if per_block is not None else src.device.type != dst.device.type:
            # Host <-> device: one contiguous copy per block straight between the pinned
            # host page and the device page (an indexed gather would stage through
            # pageable memory and halve the PCIe rate).
            for (kind, sp, ss), (_, dp, ds) in pairs:
                if kind == HOT:
                    dst.bytes[dp].copy_(src.bytes[sp], non_blocking=non_blocking)
                    continue
                scales = "scales8" if kind == "int8" else "scales4"
                size = src.slot_bytes[kind]  # a slot is one contiguous byte range of its page
                dst.bytes[dp, ds * size : (ds + 1) * size].copy_(
                    src.bytes[sp, ss * size : (ss + 1) * size], non_blocking=non_blocking
                )
                getattr(dst, scales)[dp, ds].copy_(getattr(src, scales)[sp, ss], non_blocking=non_blocking)
            return
        for kind in (HOT, *COLD_KINDS):
            sel = [(s, d) for s, d in pairs if s[0] == kind]
            if not sel:
                continue
            src_pages = torch.tensor([s[1] for s, _ in sel], device=src.device)
            dst_pages = torch.tensor([d[1] for _, d in sel], device=dst.device)
            if kind == HOT:
                dst.bytes[dst_pages] = src.bytes[src_pages].to(dst.device, non_blocking=non_blocking)
                continue
            src_slots = torch.tensor([s[2] for s, _ in sel], device=src.device)
            dst_slots = torch.tensor([d[2] for _, d in sel], device=dst.device)
            data, scales = ("int8", "scales8") if kind == "int8" else ("int4", "scales4")
            getattr(dst, data)[dst_pages, dst_slots] = getattr(src, data)[src_pages, src_slots].to(
                dst.device, non_blocking=non_blocking
            )
            getattr(dst, scales)[dst_pages, dst_slots] = getattr(src, scales)[src_pages, src_slots].to(
                dst.device, non_blocking=non_blocking
            )

    def resize_host(self, num_blocks: int, keep: dict[BlockLocation, BlockLocation]) -> None:
        """New host pool of `num_blocks` pages; `keep` maps old (kind, page, slot) -> new.
        The new pool is allocated before anything changes: a failed allocation leaves the
        old pool in place."""
        kinds = tuple(k for k in COLD_KINDS if self.host_pool.has_kind(k))
        new = _Arena(self.shape, num_blocks, torch.device("cpu"), self.host_numa_node, kinds)
        self._copy(self.host_pool, new, list(keep.items()), non_blocking=False)
        self.host_pool = new
