"""Deterministic mode's steps on a GPU the fast path runs on (engine/runner/batch_invariant.py).

The torch steps of BatchInvariantOps keep a row's result independent of the batch by
running every norm and elementwise step over fixed tiles of 256 rows, the last padded:
a batch of one pays for 256 rows, a few dozen launches a layer. The fast path's fused
kernels (fast_path/fused_ops.py) need no tiles: each program handles one row (RMSNorm
with the residual add, SiLU-and-multiply) or one token's heads (RoPE and the K/V write),
with a launch shape set by the model's widths alone, so a row is computed by the same
program code whatever else is in the step. The projections are the invariant matmul
instead of cuBLAS, over the fast path's fused q/k/v and gate/up weights (one launch each
instead of three and two; each output column is still the same fixed walk over K).

Rounding differs from the torch steps (the kernels follow the fast path, which follows
the portable model to rounding), so a GPU's deterministic outputs differ from a CPU's;
within one device they are bitwise the same alone and in any batch.
"""

from __future__ import annotations

from ..fast_path.fast_decoder import FusedOps
from ..fast_path.invariant_matmul import invariant_linear


class FusedInvariantOps(FusedOps):
    """The fast path's fused steps (FusedOps) with every projection through the invariant
    matmul: deterministic mode on the GPU (see the module docstring)."""

    project = staticmethod(invariant_linear)
