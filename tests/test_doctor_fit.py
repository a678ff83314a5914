"""The doctor's numerics: the fault-rate fit recovers known parameters from noisy
samples, the knee finder finds the knee of a synthetic sweep and of a recorded
`inferd bench serve` run, and the headroom estimate follows a known step-time line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from inferd import knee
from inferd.agent.doctor.fault_fit import fit_fault_rate
from inferd.agent.doctor.headroom import Totals, estimate
from inferd.agent.doctor.saturation import Level, knee_of, sweep_levels
from inferd.engine.bench import serve

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(("alpha", "beta"), [(0.08, 1 / 900), (0.6, 1 / 150), (0.01, 1 / 5000)])
def test_fit_recovers_alpha_and_beta_within_five_percent_from_noisy_samples(seed, alpha, beta):
    rng = np.random.default_rng(seed)
    lengths = rng.uniform(0.1 / beta, 4 / beta, 120)
    clean = alpha * (1 - np.exp(-beta * lengths))
    noisy = clean * (1 + rng.normal(0, 0.05, lengths.size))  # 5% multiplicative noise
    fit = fit_fault_rate(lengths.tolist(), noisy.tolist())
    assert fit.alpha == pytest.approx(alpha, rel=0.05)
    assert fit.beta == pytest.approx(beta, rel=0.05)
    assert 0.8 < fit.r2 <= 1.0
    assert fit.num_points == 120
    assert fit.rate(1 / beta) == pytest.approx(alpha * (1 - math.exp(-1)), rel=0.05)


def test_fit_is_exact_on_exact_samples_and_refuses_what_cannot_be_fitted():
    lengths = [100.0, 300.0, 700.0, 1500.0, 3000.0]
    fit = fit_fault_rate(lengths, [0.2 * (1 - math.exp(-x / 500)) for x in lengths])
    assert (fit.alpha, fit.beta) == (pytest.approx(0.2, rel=1e-6), pytest.approx(1 / 500, rel=1e-6))
    assert fit.r2 == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 3"):
        fit_fault_rate([1.0, 2.0], [0.1, 0.2])
    with pytest.raises(ValueError, match="do not vary"):
        fit_fault_rate([5.0, 5.0, 5.0], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="finite"):
        fit_fault_rate([1.0, 2.0, 3.0], [0.1, float("nan"), 0.3])


def test_the_doctor_and_the_bench_share_one_knee_finder():
    from inferd.agent.doctor import saturation

    assert saturation.find_knee is serve.find_knee is knee.find_knee


def test_knee_of_a_synthetic_sweep_with_the_latency_jump():
    # throughput rises linearly to 100 req/s of offered load, then flattens
    loads = [10, 20, 40, 60, 80, 100, 120, 160, 200]
    throughput = [min(x, 100) * 50.0 for x in loads]
    p99 = [0.05, 0.05, 0.06, 0.06, 0.07, 0.08, 0.9, 3.0, 6.0]
    knee = knee_of([Level(a, b, c) for a, b, c in zip(loads, throughput, p99)])
    assert knee is not None and knee.load == 100 and knee.index == 5
    assert knee.latency_jump == pytest.approx(0.9 / 0.08)
    assert knee_of([Level(x, 2.0 * x, 0.1) for x in (1, 2, 3, 4)]) is None  # never bends


@pytest.mark.parametrize(("run", "recorded_knee"), [("tiny", 8), ("small", 4)])
def test_knee_of_the_recorded_bench_serve_run(run, recorded_knee):
    doc = json.loads((RESULTS / "2026-11-29-cpu-serve-load.json").read_text())
    levels = sweep_levels(doc, run)
    knee = knee_of(levels)
    assert knee is not None
    assert knee.load == recorded_knee == doc["figures"][run]["knee_req_s"]
    assert knee.latency_jump is not None and knee.latency_jump > 2  # TTFT p99 jumps past the knee


def test_sweep_levels_reads_bench_serve_output():
    doc = {
        "levels": [
            {"offered_rps": 1, "output_tokens_per_s": 60.0, "ttft_p99": 0.1, "itl_p99": 0.02},
            {"offered_rps": 2, "output_tokens_per_s": 118.0, "ttft_p99": 0.12, "itl_p99": 0.02},
            {"offered_rps": 4, "output_tokens_per_s": 130.0, "ttft_p99": 2.0, "itl_p99": 0.05},
        ]
    }
    assert sweep_levels(doc) == [Level(1.0, 60.0, 0.1), Level(2.0, 118.0, 0.12), Level(4.0, 130.0, 2.0)]
    with pytest.raises(ValueError, match="not a sweep"):
        sweep_levels({"rows": []})


def test_headroom_follows_a_known_step_time_line():
    # t(b) = 10 ms + 0.5 ms per sequence; a 50 ms SLO allows b = 80, t = 50 ms:
    # 1600 tokens/s, at 100 tokens a request 16 req/s; 4 req/s in use leaves 12.
    points = [(b, 0.010 + 0.0005 * b) for b in (4, 8, 16, 24, 32)]
    result = estimate(points, slo_step_s=0.050, tokens_per_request=100, current_rps=4.0)
    assert result is not None
    assert result.max_batch == pytest.approx(80)
    assert result.capacity_rps == pytest.approx(16.0)
    assert result.headroom_rps == pytest.approx(12.0)
    capped = estimate(points, 0.050, 100, 4.0, max_batch=40)
    assert capped is not None and capped.max_batch == 40
    assert capped.capacity_rps == pytest.approx(40 / 0.030 / 100)
    assert estimate([(8, 0.02)] * 5, 0.05, 100, 0.0) is None  # one batch size: no slope
    assert estimate(points[:2], 0.05, 100, 0.0) is None


def test_totals_turn_counter_changes_into_points():
    earlier = Totals(1.0, 100, 400, 100, 10, 1000, 10)
    later = Totals(3.0, 200, 1400, 200, 30, 3000, 30)
    assert later.point_since(earlier) == (10.0, 0.02)
    assert earlier.point_since(earlier) is None
    assert Totals.from_values({}.get) is None
