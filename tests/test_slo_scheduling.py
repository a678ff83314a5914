"""Deadline-aware scheduling: slack order within an effective priority, best-effort
requests aged past a stream of deadline ones, deadline sequences meeting their TPOT not
preempted for best-effort ones; the TTFT predictor on recorded step timings."""

from __future__ import annotations

import time

import pytest

from inferd.engine import EngineConfig, LLMEngine, SamplingParams
from inferd.engine.slo import RequestSlo
from inferd.engine.stats import StepStats
from inferd.engine.ttft_predictor import TtftPredictor


def slo(ttft: float | None, tpot: float | None = None, name: str = "interactive") -> RequestSlo:
    deadline = None if ttft is None else time.time() + ttft
    return RequestSlo(name, ttft, tpot, deadline)


def step(batch: int, tokens: int, duration: float) -> StepStats:
    return StepStats(batch, tokens, duration=duration)


def test_predictor_on_recorded_steps():
    p = TtftPredictor(alpha=0.5)
    assert p.predict(100, 10) is None  # nothing measured: no guess
    p.observe(step(0, 0, 0.5))  # an idle step says nothing
    p.observe(step(2, 2, 0.0))  # nor an untimed one
    assert p.prefill_tokens_per_s is None and p.decode_step_s is None
    p.observe(step(2, 1000, 0.1))  # prefill: 10,000 tokens/s
    p.observe(step(4, 4, 0.02))  # pure decode
    p.observe(step(3, 2002, 0.1))  # prefill: 20,020 tokens/s
    p.observe(step(4, 4, 0.04))
    assert p.prefill_tokens_per_s == pytest.approx(15010.0)
    assert p.decode_step_s == pytest.approx(0.03)
    assert (p.num_prefill_steps, p.num_decode_steps) == (2, 2)
    assert p.predict(13010, 2000) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        TtftPredictor(alpha=0)


def test_engine_feeds_its_predictor(tiny_model):
    engine = LLMEngine(EngineConfig(model=tiny_model, block_size=8))
    engine.add_request("r", "hello there", SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    p = engine.ttft_predictor
    assert p.num_prefill_steps >= 1 and p.prefill_tokens_per_s > 0
    assert p.num_decode_steps >= 1 and p.decode_step_s > 0
    assert engine.scheduler.predictor is p


def test_waiting_order_is_priority_then_slack_then_arrival(tiny_model):
    engine = LLMEngine(EngineConfig(model=tiny_model, block_size=8))
    engine.ttft_predictor.prefill_tokens_per_s = 100.0  # 10 tokens: 0.1 s
    p = SamplingParams(max_tokens=2)
    now = time.time()
    add = engine.add_request
    add("best-effort", [5] * 10, p, slo=RequestSlo("batch"))
    add("plain", [5] * 10, p)  # no SLO at all: best effort too
    add("urgent-be", [5] * 10, p, priority=-1, slo=RequestSlo("batch"))
    add("far", [5] * 10, p, slo=RequestSlo("i", 1.0, None, now + 1.0))  # slack now + 0.9
    add("near", [5] * 10, p, slo=RequestSlo("i", 0.5, None, now + 0.5))  # now + 0.4
    add("long", [5] * 60, p, slo=RequestSlo("i", 0.8, None, now + 0.8))  # now + 0.2
    order = [s.request_id for s in engine.scheduler._order(engine.scheduler.waiting)]
    assert order == ["urgent-be", "long", "near", "far", "best-effort", "plain"]


def test_without_deadlines_the_order_is_priority_and_arrival(tiny_model):
    engine = LLMEngine(EngineConfig(model=tiny_model, block_size=8))
    p = SamplingParams(max_tokens=2)
    engine.add_request("a", [5] * 10, p, slo=RequestSlo("batch"))  # a best-effort class changes nothing
    engine.add_request("b", [5] * 40, p, priority=-1)
    engine.add_request("c", [5] * 10, p)
    assert not engine.scheduler.has_deadlines
    assert [s.request_id for s in engine.scheduler._order(engine.scheduler.waiting)] == ["b", "a", "c"]


def test_deadline_requests_are_admitted_first_and_best_effort_is_not_starved(tiny_model):
    """One slot, a deadline request arriving every step: they go ahead of an older
    best-effort request only until it has aged a level; then it runs."""
    engine = LLMEngine(EngineConfig(model=tiny_model, block_size=8, max_num_seqs=1, priority_aging_steps=2))
    p = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    engine.add_request("batch", "x", p, slo=RequestSlo("batch"))
    admitted: list[str] = []
    for i in range(40):
        engine.add_request(f"i{i}", "y", p, slo=slo(60.0))
        engine.step()
        admitted += [s.request_id for s in engine.scheduler.running if s.request_id not in admitted]
        if "batch" in admitted:
            break
    assert admitted[0] == "i0"  # the deadline request overtook the older best-effort one
    assert "batch" in admitted and admitted.index("batch") <= 3


def _squeeze(tiny_model, interactive_tpot: float) -> tuple:
    """Two requests that a 64-block pool cannot hold to their end; the best-effort one is
    more urgent by priority, so without protection the deadline one is its victim."""
    engine = LLMEngine(
        EngineConfig(model=tiny_model, block_size=16, kv_cache_bytes=524288, preemption_mode="recompute", watermark=0.0)
    )
    p = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
    engine.add_request("batch", [7] * 480, p, priority=-1, slo=RequestSlo("batch"))
    engine.add_request("interactive", [9] * 480, p, slo=slo(3600.0, interactive_tpot))
    batch, interactive = (engine.requests[rid].seqs[0] for rid in ("batch", "interactive"))
    finished = []
    while engine.has_unfinished():
        finished += [o.request_id for o in engine.step() if o.finished]
    return batch, interactive, finished


def test_a_deadline_sequence_meeting_its_tpot_is_not_preempted_for_best_effort(tiny_model):
    batch, interactive, finished = _squeeze(tiny_model, interactive_tpot=60.0)
    assert interactive.num_preemptions == 0 and batch.num_preemptions >= 1
    assert sorted(finished) == ["batch", "interactive"]


def test_a_deadline_sequence_missing_its_tpot_may_be_preempted(tiny_model):
    batch, interactive, finished = _squeeze(tiny_model, interactive_tpot=1e-4)
    assert interactive.num_preemptions >= 1 and batch.num_preemptions == 0
    assert finished == ["batch", "interactive"]


def _seats(tiny_model, deadline: bool, batch_priority: int = 0) -> tuple[LLMEngine, list[str]]:
    """Two seats held by long best-effort requests; then one more request arrives."""
    engine = LLMEngine(EngineConfig(model=tiny_model, block_size=8, max_num_seqs=2, preemption_mode="swap"))
    long = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for name in ("batch-a", "batch-b"):
        engine.add_request(name, [5] * 12, long, priority=batch_priority, slo=RequestSlo("batch"))
    for _ in range(3):
        engine.step()
    short = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    engine.add_request("late", [6] * 12, short, slo=slo(60.0) if deadline else RequestSlo("batch"))
    engine.step()
    return engine, [s.request_id for s in engine.scheduler.running]


def test_a_deadline_request_takes_a_best_effort_seat_in_the_step_it_waits(tiny_model):
    engine, running = _seats(tiny_model, deadline=True)
    assert "late" in running and len(running) == 2
    late_seq = engine.requests["late"].seqs[0]
    assert late_seq.num_computed_tokens > 0  # prefilled in that step, not one later
    victims = [rid for rid in ("batch-a", "batch-b") if engine.requests[rid].seqs[0].num_preemptions]
    assert victims == ["batch-b"]  # the least urgent: the later arrival
    assert engine.requests["batch-b"].seqs[0].status.name == "WAITING"  # recomputed, not swapped
    finished = []
    while engine.has_unfinished():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert sorted(finished) == ["batch-a", "batch-b", "late"]


def test_best_effort_waits_for_a_seat_and_a_more_urgent_sequence_is_not_taken(tiny_model):
    _, running = _seats(tiny_model, deadline=False)
    assert "late" not in running  # best effort: no seat is taken for it
    engine, running = _seats(tiny_model, deadline=True, batch_priority=-1)
    assert "late" not in running  # the running ones are more urgent by priority
    assert all(engine.requests[r].seqs[0].num_preemptions == 0 for r in ("batch-a", "batch-b"))
