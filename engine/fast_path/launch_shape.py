"""Launch-shape arithmetic for the Triton kernels' host code: the check the product
kernels share (triton_gemv.py, triton_rows.py), and grid and block sizes.

`cdiv` and `next_power_of_2` are plain functions, not `triton.cdiv` and
`triton.next_power_of_2`: in recent Triton those are constexpr functions, usable inside
kernels, and a call from host code goes through their wrapper (Triton 3.9 on a 2-core
CPU: 1.7 us a call, against 0.07 us). An eager prefill step makes six such calls a
layer, and such a step is bound by its host.
"""

from __future__ import annotations

WARP_COUNTS = (1, 2, 4, 8, 16)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive b."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def check_launch_shape(block_n: int, block_k: int, num_warps: int, num_stages: int, min_block: int = 1) -> None:
    """Raise ValueError naming the first field that is not a launch shape: tile sizes are
    powers of two (of at least `min_block`), the warp count one Triton takes, one stage or more."""
    for name, value in (("block_n", block_n), ("block_k", block_k)):
        if value < min_block or value & (value - 1):
            least = f" of at least {min_block}" if min_block > 1 else ""
            raise ValueError(f"{name} must be a power of two{least}, got {value}")
    if num_warps not in WARP_COUNTS:
        raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {num_warps}")
    if num_stages < 1:
        raise ValueError(f"num_stages must be at least 1, got {num_stages}")
