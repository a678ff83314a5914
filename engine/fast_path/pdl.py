"""Programmatic dependent launch (PDL, Hopper and later): a kernel may start while the
kernel before it in the stream is still finishing, and waits for it (griddepcontrol)
only where it first reads that kernel's results.

A batch-1 decode step is a chain of ~160 kernels of 2-240 us each; without PDL each
one starts only after the previous one has drained, so every boundary costs a ramp-up
of a few microseconds. With PDL the next kernel's programs are already resident and
can issue the loads that do not depend on the previous kernel before waiting. On the
H200 (2026-11-29): the launch overlap paid about 1 % of a
batch-1 step; releasing the next kernel after each GEMV's and the attention's loop
(INFERD_PDL_RELEASE=loop, the default) about 0.5-1 % more; releasing it at a kernel's
start, or loading the GEMVs' first weights before waiting (into L2 or registers),
made the step slower.

Rules that keep this correct: a kernel launched with `launch_pdl=True` must call
`wait_for_previous()` before touching memory that the previous kernel writes or reads
(its inputs, and its outputs, which may reuse freed memory). Every such kernel waits
before it releases the next one, so when a kernel starts, everything before the
previous kernel has finished: memory written earlier than that (a step's context
lengths and block tables, copied in before its first kernel) may be read before the
wait. Kernels launched without PDL are unaffected.
"""
from __future__ import annotations

import functools
import os

import torch

from .availability import has_triton

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # Triton without griddepcontrol (or without triton at all)
    gdc_launch_dependents = gdc_wait = None

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

    @triton.jit
    def release_dependents(USE_PDL: tl.constexpr, EARLY_RELEASE: tl.constexpr):
        """With EARLY_RELEASE, let the next kernel's programs in once every program of
        this one has passed this point (placed after a GEMV's loop: its last programs'
        epilogues and the next kernel's start then overlap); otherwise they come in as
        this kernel's programs exit. Correctness does not depend on it: the next kernel
        still waits for this one to finish before reading its results."""
        if USE_PDL and EARLY_RELEASE:
            gdc_launch_dependents()


def pdl_launch(device: torch.device, releases: bool = False) -> dict:
    """Keyword arguments for launching a kernel that calls `wait_for_previous(USE_PDL)`
    (and, with `releases`, `release_dependents(USE_PDL, EARLY_RELEASE)`)."""
    args = {"USE_PDL": True, "launch_pdl": True} if pdl_enabled(device) else {"USE_PDL": False}
    if releases:
        args["EARLY_RELEASE"] = args["USE_PDL"] and early_release_enabled()
    return args


def early_release_enabled() -> bool:
    """INFERD_PDL_RELEASE=loop (the default): kernels that call release_dependents let the
    next kernel in after their loops; `exit`: as their programs exit."""
    value = os.environ.get("INFERD_PDL_RELEASE", "loop")
    if value not in ("exit", "loop"):
        raise ValueError(f"INFERD_PDL_RELEASE must be 'exit' or 'loop', got {value!r}")
    return value == "loop"


def pdl_enabled(device: torch.device) -> bool:
    """PDL on this device: CUDA compute capability 9.0+, a Triton with griddepcontrol,
    not the CPU interpreter, and not switched off with INFERD_PDL=0 (read at each call:
    the benchmark turns it off and on)."""
    if os.environ.get("INFERD_PDL", "1") == "0" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _device_has_pdl(device)


@functools.cache
def _device_has_pdl(device: torch.device) -> bool:
    """Cached: every launch of an eager step asks, and the answer cannot change."""
    if device.type != "cuda" or gdc_wait is None or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (9, 0)
