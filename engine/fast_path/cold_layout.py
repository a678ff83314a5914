"""The usual shape of a batch's cold KV: each sequence's cold blocks lead its table.

Blocks turn cold oldest first and never back, so a sequence's table is normally a run
of cold blocks of one kind followed by hot ones. For such batches the decode kernel
can loop over the cold run and then over the hot run, each with one kind of load and
nothing to decide per tile (attention/cold_prefix.py); other layouts (a run
time switch between int8 and int4 left both in one sequence, or a block that could not
be quantized for lack of memory) take the general per-tile kernel.
"""

from __future__ import annotations

import numpy as np


def cold_prefix_layout(kinds: np.ndarray) -> tuple[np.ndarray, int] | None:
    """kinds: [B, W] kind codes per table entry (0 hot; padding entries 0).

    Returns (leading cold blocks per row, the kind code shared by every cold entry),
    with kind 0 when nothing is cold; None when some row's cold entries do not form a
    leading run or the batch mixes cold kinds."""
    if kinds.ndim != 2:
        raise ValueError(f"kinds must be [batch, blocks], got shape {kinds.shape}")
    cold = kinds != 0
    counts = cold.sum(axis=1).astype(np.int32)
    if not counts.any():
        return counts, 0
    leading = np.arange(kinds.shape[1])[None, :] < counts[:, None]
    if not np.array_equal(cold, leading):
        return None
    codes = kinds[cold]
    kind = int(codes.min())
    if int(codes.max()) != kind:
        return None
    return counts, kind
