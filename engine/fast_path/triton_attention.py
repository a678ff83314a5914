"""The fast path's attention dispatcher under its former module name, for callers not
yet importing engine.fast_path.attention (engine/parallel/worker.py)."""
from .attention import triton_paged_attention

__all__ = ["triton_paged_attention"]
