"""Programmatic dependent launch (PDL, Hopper and later): a kernel may start while the
kernel before it in the stream is still finishing, and waits for it (griddepcontrol)
only where it first reads that kernel's results.

A batch-1 decode step is a chain of ~160 kernels of 5-50 us each; without PDL each
one starts only after the previous one has drained, so every boundary costs a ramp-up
of a few microseconds. With PDL the next kernel's programs are already resident and
could issue the loads that do not depend on the previous kernel before waiting. On the
H200 only the launch overlap paid (about 1 % of a batch-1 step); prefetching the
GEMVs' first weights into L2 before waiting, or letting the next kernel launch before
this one's programs exit, made the step slower (BENCHMARKS.md, session 4).

Rules that keep this correct: a kernel launched with `launch_pdl=True` must call
`wait_for_previous()` before touching memory that any earlier kernel writes or reads
(its inputs, and its outputs, which may reuse freed memory). Kernels launched without
PDL are unaffected.
"""
from __future__ import annotations

import os

import torch

from .availability import has_triton

try:
    from triton.language.extra.cuda import gdc_wait
except ImportError:  # Triton without griddepcontrol (or without triton at all)
    gdc_wait = None

if has_triton():
    import triton
    import triton.language as tl

    @triton.jit
    def wait_for_previous(USE_PDL: tl.constexpr):
        """Wait until the previous kernel has finished and its writes are visible. The
        next kernel is let in as this one's programs exit (no early launch_dependents:
        on the H200 that made the batch-1 step 5 % slower). No-op without PDL."""
        if USE_PDL:
            gdc_wait()


def pdl_launch(device: torch.device) -> dict:
    """Keyword arguments for launching a kernel that calls `wait_for_previous(USE_PDL)`."""
    if pdl_enabled(device):
        return {"USE_PDL": True, "launch_pdl": True}
    return {"USE_PDL": False}


def pdl_enabled(device: torch.device) -> bool:
    """PDL on this device: CUDA compute capability 9.0+, a Triton with griddepcontrol,
    not the CPU interpreter, and not switched off with INFERD_PDL=0."""
    if os.environ.get("INFERD_PDL", "1") == "0" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if device.type != "cuda" or gdc_wait is None or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (9, 0)
