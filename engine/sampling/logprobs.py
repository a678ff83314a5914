"""The logprobs a request asks for, computed on the device and read on the host.

A row with `logprobs=N` gets the N most likely tokens with their log-probabilities, and
its chosen token's, all of the raw model output (log_softmax of the float logits before
penalties, bias, masks or filters, as vLLM V1 returns them). The batch's top-k is taken
once, k the largest N asked for.

They ride in the int64 answer that carries the step's tokens, after them: the float64
values bit for bit (a dtype view, no conversion), then the top ids. The layout is known
on the host before the step runs, from the rows' parameters alone. Two readers share
it: the synchronous sampler (engine/sampling/sampler.py, one blocking transfer) and a step
launched ahead of the host (engine/sampling/token_readback.py, one non-blocking copy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..memory.device_index import device_index


@dataclass(frozen=True, slots=True)
class LogprobLayout:
    """Where a step's logprobs lie in its int64 block: [R, 1 + k] float64 (the chosen
    token's logprob, then the top k values) viewed as int64, then the [R, k] top ids,
    for the R rows that ask for logprobs."""

    rows: list[int]  # the rows of the batch that ask for logprobs
    wanted: list[int]  # N for each of them
    k: int  # the largest N: how many the top-k takes per row

    @classmethod
    def of(cls, wanted: list[int | None]) -> LogprobLayout | None:
        """The layout for a batch whose rows ask for `wanted` (None: no logprobs); None
        when no row asks."""
        rows = [i for i, n in enumerate(wanted) if n is not None]
        if not rows:
            return None
        ns = [n for n in wanted if n is not None]
        return cls(rows, ns, max(ns))

    @property
    def size(self) -> int:
        """int64 elements in the block."""
        return len(self.rows) * (1 + 2 * self.k)

    def pack(self, raw: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The block, [size] int64 on the device, from the batch's raw float logits
        [B, V] and chosen tokens [B]. Nothing is read back."""
        if len(self.rows) < raw.shape[0]:
            index = device_index(self.rows, raw.device)
            raw, tokens = raw.index_select(0, index), tokens.index_select(0, index)
        lp = torch.log_softmax(raw, dim=-1)
        top = torch.topk(lp, self.k, dim=-1)
        values = torch.cat([lp.gather(1, tokens[:, None]), top.values], dim=1)
        # float32 values are exact in float64; the view keeps their bits in an int64 buffer
        return torch.cat([values.to(torch.float64).flatten().view(torch.int64), top.indices.flatten()])

    def unpack(self, tokens: list[int], block: torch.Tensor) -> list[dict[int, float] | None]:
        """Per row of the batch: its top-N ids -> logprob, with its chosen token's added
        (the sampler's answer); None for rows that ask for none. `tokens`: the batch's
        chosen ids; `block`: this layout's block, on the host."""
        num, width = len(self.rows), 1 + self.k
        values = block[: num * width].view(torch.float64).view(num, width).tolist()
        top_ids = block[num * width : self.size].view(num, self.k).tolist()
        out: list[dict[int, float] | None] = [None] * len(tokens)
        for i, n, row_values, row_ids in zip(self.rows, self.wanted, values, top_ids):
            entry = dict(zip(row_ids[:n], row_values[1 : 1 + n]))
            entry.setdefault(tokens[i], row_values[0])
            out[i] = entry
        return out
