"""The KV page-fault rate against sequence length, lambda(L) = alpha (1 - exp(-beta L)),
fitted by least squares.

Given beta the model is linear in alpha, so alpha(beta) has a closed form; a coarse
scan of log(beta) over the lengths' scale finds the basin, and Gauss-Newton with
Levenberg damping on (alpha, beta) refines it. numpy only (no scipy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class FaultFit:
    alpha: float  # the rate the pool saturates at (faults per scheduled block)
    beta: float  # per token: 1/beta is the length at which the rate reaches 63% of alpha
    r2: float
    num_points: int

    def rate(self, length: float) -> float:
        return self.alpha * (1.0 - math.exp(-self.beta * length))


def _alpha_for(beta: float, x: np.ndarray, y: np.ndarray) -> float:
    g = 1.0 - np.exp(-beta * x)
    denom = float(g @ g)
    return float(g @ y) / denom if denom > 0 else 0.0


def _sse(alpha: float, beta: float, x: np.ndarray, y: np.ndarray) -> float:
    r = y - alpha * (1.0 - np.exp(-beta * x))
    return float(r @ r)


def fit_fault_rate(lengths, rates, iterations: int = 100) -> FaultFit:
    """Least-squares (alpha, beta) with alpha, beta > 0. ValueError with fewer than three
    points, non-finite values, or lengths that do not vary."""
    x = np.asarray(lengths, dtype=float)
    y = np.asarray(rates, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"lengths and rates must be equal-length lists, got {x.shape} and {y.shape}")
    if len(x) < 3:
        raise ValueError(f"need at least 3 points for two parameters and a residual, got {len(x)}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("lengths and rates must be finite")
    if np.any(x <= 0):
        raise ValueError("lengths must be > 0")
    if float(np.ptp(x)) == 0.0:
        raise ValueError("lengths do not vary: beta cannot be told from alpha")
    scale = float(np.median(x))
    betas = np.logspace(-3, 3, 121) / scale
    beta = float(min(betas, key=lambda b: _sse(_alpha_for(b, x, y), b, x, y)))
    alpha = _alpha_for(beta, x, y)
    damping, converged = 1e-3, False
    sse = _sse(alpha, beta, x, y)
    for _ in range(iterations):
        e = np.exp(-beta * x)
        residual = y - alpha * (1.0 - e)
        jacobian = np.stack([1.0 - e, alpha * x * e], axis=1)  # d model / d(alpha, beta)
        jtj = jacobian.T @ jacobian
        jtr = jacobian.T @ residual
        improved = False
        while damping < 1e12:
            step = np.linalg.solve(jtj + damping * np.diag(np.diag(jtj) + 1e-300), jtr)
            a_new, b_new = alpha + float(step[0]), beta + float(step[1])
            if a_new > 0 and b_new > 0:
                sse_new = _sse(a_new, b_new, x, y)
                if sse_new < sse:
                    alpha, beta, damping, improved = a_new, b_new, damping / 10, True
                    converged = sse - sse_new <= 1e-14 * max(sse, 1e-300)
                    sse = sse_new
                    break
            damping *= 10
        if not improved or converged:
            break
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - sse / total if total > 0 else (1.0 if sse == 0 else 0.0)
    return FaultFit(alpha, beta, r2, len(x))
