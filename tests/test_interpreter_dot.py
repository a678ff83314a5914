"""The interpreter's dot used by every Triton kernel test (tests/interpreter_dot.py): the
same rounding for an output whatever the tile shape and the processor's BLAS kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inferd.engine.fast_path.availability import has_triton

from interpreter_dot import dot_in_k_order

TESTS = Path(__file__).parent


def test_an_output_rounds_the_same_in_every_tile_shape():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    b = rng.standard_normal((64, 128)).astype(np.float32)
    full = dot_in_k_order(a, b, np.dtype(np.float32))
    assert full.dtype == np.float32 and full.shape == (64, 128)
    for n in (16, 32, 64):
        assert np.array_equal(dot_in_k_order(a, np.ascontiguousarray(b[:, :n]), np.dtype(np.float32)), full[:, :n])
    for m in (1, 8):
        assert np.array_equal(dot_in_k_order(a[:m], b, np.dtype(np.float32)), full[:m])
    np.testing.assert_allclose(full, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_batched_operands_keep_their_leading_dimension():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4, 8)).astype(np.float32)
    b = rng.standard_normal((3, 8, 5)).astype(np.float32)
    np.testing.assert_allclose(dot_in_k_order(a, b, np.dtype(np.float32)), a @ b, rtol=1e-5, atol=1e-5)


def cpu_has_avx2() -> bool:
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


# Under OpenBLAS's Haswell kernel np.matmul rounds an element by the product's shape; the
# invariant matmul's block_n follows the number of rows, so that alone made a row's
# outputs differ alone and in a batch under the interpreter.
PROBE = """
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, {tests!r})
import torch
import interpreter_dot
from inferd.engine.fast_path.invariant_matmul import invariant_linear

def widths_agree():
    gen = torch.Generator().manual_seed(2)
    x, weight = torch.randn(5, 64, generator=gen), torch.randn(144, 64, generator=gen)
    outs = [invariant_linear(x, weight, block_n=n) for n in (16, 32, 64, 128)]
    return all(torch.equal(o, outs[0]) for o in outs)

before = widths_agree()
interpreter_dot.install()
print(before, widths_agree())
"""


@pytest.mark.skipif(not has_triton(), reason="needs triton (pip) for its CPU interpreter")
@pytest.mark.skipif(not cpu_has_avx2(), reason="needs an AVX2 processor for OpenBLAS's Haswell kernel")
def test_block_widths_agree_bitwise_under_the_haswell_blas_kernel():
    env = {**os.environ, "OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_NUM_THREADS": "1"}
    probe = subprocess.run(
        [sys.executable, "-c", PROBE.format(tests=str(TESTS))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    before, after = probe.stdout.split()[-2:]
    assert before == "False"  # numpy's dot: the widths round differently (the failure's cause)
    assert after == "True"  # the K-ordered dot: bitwise the same, as on the GPU
