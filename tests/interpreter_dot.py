"""Triton's CPU interpreter with a `tl.dot` whose rounding does not depend on the tile's shape.

The interpreter computes `tl.dot` with `np.matmul`, and numpy hands that to its bundled
OpenBLAS, which picks a kernel by the processor and the matrix shape. On some of them
(OpenBLAS's Haswell and Zen kernels, taken on AMD hosts or where OPENBLAS_CORETYPE says so)
an output element of a 64 x 64 by 64 x 32 product rounds differently from the same element
of the 64 x 64 by 64 x 64 product: the summation order over K follows the shape. A GPU's
tensor cores do not: each output's sum walks K in the same instruction k-steps whatever the
tile is, which is what the batch-invariant kernels rely on (their `block_n` follows the
number of rows). So under the interpreter a kernel's promise "a row's result does not depend
on the batch" was tested against BLAS's choices, not against the kernel.

`install()` replaces the interpreter's floating-point dot with one that adds the K products
in order, one rounding per product and per addition, for every output alike: the same
result for an element whatever the tile's M and N and whatever the processor, as on the
GPU. Integer dots stay numpy's (exact).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

import numpy as np


def dot_in_k_order(a: np.ndarray, b: np.ndarray, acc_dtype: np.dtype) -> np.ndarray:
    """a [..., M, K] @ b [..., K, N] in acc_dtype, each output's K products added in order."""
    a = a.astype(acc_dtype, copy=False)
    b = b.astype(acc_dtype, copy=False)
    shape = np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, b.shape[-1]))
    total, product = np.zeros(shape, dtype=acc_dtype), np.empty(shape, dtype=acc_dtype)
    for k in range(a.shape[-1]):
        np.multiply(a[..., :, k : k + 1], b[..., k : k + 1, :], out=product)
        np.add(total, product, out=total)
    return total


INTERPRETER = "triton.runtime.interpreter"


def install() -> None:
    """Give the interpreter the K-ordered dot (see the module docstring): now if triton is
    imported, else when it is. Importing triton here would be too early: its own
    @jit helpers are interpreted only if TRITON_INTERPRET is set before the import, which
    the kernel test modules do when they are collected."""
    module = sys.modules.get(INTERPRETER)
    if module is not None:
        patch(module)
    elif importlib.util.find_spec("triton") is not None and not any(
        isinstance(f, PatchWhenImported) for f in sys.meta_path
    ):
        sys.meta_path.insert(0, PatchWhenImported())


class PatchWhenImported(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when the interpreter module is about to load, wraps its loader
    so that `patch` runs on the module right after it executes."""

    def find_spec(self, fullname, path, target=None):  # type: ignore[override]
        if fullname != INTERPRETER:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_then_patch(module) -> None:
            execute(module)
            patch(module)

        spec.loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def patch(interpreter) -> None:
    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "in_k_order", False):
        return
    numpy_dot = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if not np.issubdtype(d.data.dtype, np.floating):
            return numpy_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        a_data, b_data = a.data, b.data
        if (a.dtype.primitive_bitwidth == 8 and a.dtype.is_floating()) or (
            b.dtype.primitive_bitwidth == 8 and b.dtype.is_floating()
        ):
            a_data = interpreter._convert_float(a_data, a.dtype, interpreter.tl.float16, None).view(np.float16)
            b_data = interpreter._convert_float(b_data, b.dtype, interpreter.tl.float16, None).view(np.float16)
        product = dot_in_k_order(a_data, b_data, d.data.dtype)
        return interpreter.TensorHandle(product + d.data, d.dtype.scalar)

    create_dot.in_k_order = True  # type: ignore[attr-defined]
    builder.create_dot = create_dot
