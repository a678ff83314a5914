"""The host-phase timer of the GPU benchmarks, on a tiny CPU engine."""

from __future__ import annotations

import pytest

from inferd.engine import LLM, SamplingParams
from inferd.engine.bench.phase_timer import PhaseTimer


def test_phases_of_a_request_are_timed_and_the_methods_restored(model_factory):
    llm = LLM(model_factory(preset="tiny"), mode="fallback", block_size=8)
    engine = llm.engine
    own = engine.output_processor.process  # a bound method: the class's
    engine.runner.execute = engine.runner.execute  # an instance attribute of its own
    kept = engine.runner.execute
    phases = {
        "schedule": (engine.scheduler, "schedule"),
        "run": (engine.runner, "execute"),
        "outputs": (engine.output_processor, "process"),
    }
    with PhaseTimer(phases) as timer:
        llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert all(seconds > 0 for seconds in timer.totals.values()), timer.totals
    assert "process" not in vars(engine.output_processor) and engine.output_processor.process == own
    assert engine.runner.execute is kept
    timer.reset()
    assert set(timer.totals) == set(phases) and not any(timer.totals.values())


def test_a_phase_naming_no_method_is_refused():
    with pytest.raises(ValueError, match="phase 'x': object has no method 'nope'"):
        PhaseTimer({"x": (object(), "nope")})


def test_warm_prefix_profile_splits_a_ttft_into_host_phases(model_factory, tmp_path):
    from inferd.engine.bench.gpu_decode import profile_prefix

    llm = LLM(model_factory(preset="tiny"), mode="fallback", block_size=8)
    path = tmp_path / "profile.txt"
    result = profile_prefix(llm.engine, 100, str(path), prefix_len=32, new_tokens=4, timed=3, profiled=1)
    phases = result["host_phases_median_ms"]
    assert set(phases) == {"ttft", "schedule", "runner", "outputs"}  # no decode graphs on the portable path
    assert 0 < phases["schedule"] < phases["ttft"] and 0 < phases["runner"] < phases["ttft"]
    assert llm.engine.block_manager.prefix.hits >= 4 * 32  # the four warm requests hit the cached prefix
    assert path.read_text().startswith("warm TTFT, 32 cached + 4 new tokens: ")
