"""Whether the Triton fast path can run here, and why not when it cannot.

Importing this module never needs CUDA or Triton: CPU-only machines import the
whole `engine.fast_path` package and simply get a reason instead of kernels.
"""

from __future__ import annotations

import importlib.util

import torch

FAST_DTYPES = (torch.bfloat16, torch.float16)
MIN_COMPUTE_CAPABILITY = (8, 0)  # bf16 tensor-core dots


def has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when the fast path can run on `device` in `dtype`; otherwise why not."""
    if device.type != "cuda":
        return f"device is {device.type}, the fast path needs CUDA"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    if not has_triton():
        return "triton is not installed"
    if dtype not in FAST_DTYPES:
        return f"dtype {dtype} is not bfloat16/float16"
    if torch.cuda.get_device_capability(device) < MIN_COMPUTE_CAPABILITY:
        return f"compute capability {torch.cuda.get_device_capability(device)} is below 8.0"
    return None
