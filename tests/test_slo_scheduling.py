"""Deadline-aware scheduling: deadline requests before best effort, slack order within an
effective priority, best effort kept from starving by its share of the seats (not by aging
past deadline requests), deadline sequences meeting their TPOT not preempted for
best-effort ones; the TTFT predictor on recorded step timings."""

from __future__ import annotations

import time

import pytest

from inferd.engine import EngineConfig, LLMEngine, SamplingParams
from inferd.engine.request.slo import RequestSlo
from inferd.engine.scheduling.ttft_predictor import TtftPredictor
from inferd.engine.stats import FinishedRequestStats, StepStats


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
    assert p.seat_s is None and p.predict(13010, 2000, seats_short=2, num_seats=4) == pytest.approx(1.0)
    done = step(1, 1, 0.01)
    done.finished = [FinishedRequestStats("length", 10, 5, 9.0, 1.0, 2.0, 6.0)]  # 8 s in its seat
    p.observe(done)
    assert p.seat_s == pytest.approx(8.0) and p.num_finished == 1
    assert p.predict(13010, 2000, seats_short=2, num_seats=4) == pytest.approx(5.0)  # + 2 x 8 / 4
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


def test_waiting_order_is_deadline_tier_then_priority_then_slack_then_arrival(tiny_model):
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
    assert order == ["long", "near", "far", "urgent-be", "best-effort", "plain"]
    for seq in engine.scheduler.waiting:  # long waits: aging moves no best-effort request past a deadline one
        if seq.slo is None or seq.slo.deadline is None:
            seq.arrival_step -= 100 * engine.config.priority_aging_steps
    order = [s.request_id for s in engine.scheduler._order(engine.scheduler.waiting)]
    assert order[:3] == ["long", "near", "far"]


def test_without_deadlines_the_order_is_priority_and_arrival(tiny_model):
    engine = LLMEngine(EngineConfig(model=tiny_model, block_size=8))
    p = SamplingParams(max_tokens=2)
    engine.add_request("a", [5] * 10, p, slo=RequestSlo("batch"))  # a best-effort class changes nothing
    engine.add_request("b", [5] * 40, p, priority=-1)
    engine.add_request("c", [5] * 10, p)
    assert not engine.scheduler.has_deadlines
    assert [s.request_id for s in engine.scheduler._order(engine.scheduler.waiting)] == ["b", "a", "c"]


def _stream_of_deadline_requests(tiny_model, share: float, steps: int = 60) -> tuple[list[int], list[str]]:
    """Four seats, three best-effort requests waiting from the start, and two deadline
    requests arriving every step, more than the seats serve (aging every 2 steps, so every
    best-effort request ages past every newer deadline request many times over). Returns the
    best-effort sequences running after each step, and the requests finished."""
    engine = LLMEngine(
        EngineConfig(
            model=tiny_model, block_size=8, max_num_seqs=4, priority_aging_steps=2, best_effort_seat_share=share
        )
    )
    p = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"batch{i}", "x", p, slo=RequestSlo("batch"))
    best_effort_running: list[int] = []
    finished: list[str] = []
    for i in range(steps):
        for j in range(2):
            engine.add_request(f"i{i}-{j}", "y", p, slo=slo(60.0))
        finished += [o.request_id for o in engine.step() if o.finished]
        best_effort_running.append(sum(s.request_id.startswith("batch") for s in engine.scheduler.running))
    return best_effort_running, finished


def test_deadline_requests_go_first_and_best_effort_keeps_its_seat(tiny_model):
    best_effort_running, finished = _stream_of_deadline_requests(tiny_model, share=0.25)  # one seat of four
    assert {"batch0", "batch1", "batch2"} <= set(finished)  # one at a time, in its own seat
    last_batch_step = max(i for i, n in enumerate(best_effort_running) if n)
    held = best_effort_running[1 : last_batch_step + 1]
    assert max(held) == 1  # deadline requests hold the other three seats
    assert all(a or b for a, b in zip(held, held[1:]))  # a finished one's seat goes to the next at once
    assert sum(r.startswith("i") for r in finished) >= 3 * 3


def test_without_a_best_effort_share_a_stream_of_deadline_requests_starves_best_effort(tiny_model):
    best_effort_running, finished = _stream_of_deadline_requests(tiny_model, share=0.0)
    assert not any(r.startswith("batch") for r in finished)
    assert not any(best_effort_running[1:])


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


@pytest.mark.parametrize("interactive_tpot", [60.0, 1e-4])
def test_a_deadline_sequence_is_not_preempted_for_a_more_urgent_best_effort_one(tiny_model, interactive_tpot):
    batch, interactive, finished = _squeeze(tiny_model, interactive_tpot)
    assert interactive.num_preemptions == 0 and batch.num_preemptions >= 1
    assert finished == ["interactive", "batch"]


def _seats(tiny_model, deadline: bool, num_late: int = 1) -> tuple[LLMEngine, list[str]]:
    """Two seats held by long best-effort requests; then more requests arrive."""
    engine = LLMEngine(
        EngineConfig(
            model=tiny_model, block_size=8, max_num_seqs=2, preemption_mode="swap", best_effort_seat_share=0.25
        )
    )
    long = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for name in ("batch-a", "batch-b"):
        engine.add_request(name, [5] * 12, long, priority=-1, slo=RequestSlo("batch"))  # priority: no protection
    for _ in range(3):
        engine.step()
    short = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    for i in range(num_late):
        engine.add_request(f"late{i}", [6] * 12, short, slo=slo(60.0) if deadline else RequestSlo("batch"))
    engine.step()
    return engine, [s.request_id for s in engine.scheduler.running]


def test_a_deadline_request_takes_a_best_effort_seat_in_the_step_it_waits(tiny_model):
    engine, running = _seats(tiny_model, deadline=True)
    assert "late0" in running and len(running) == 2
    late_seq = engine.requests["late0"].seqs[0]
    assert late_seq.num_computed_tokens > 0  # prefilled in that step, not one later
    victims = [rid for rid in ("batch-a", "batch-b") if engine.requests[rid].seqs[0].num_preemptions]
    assert victims == ["batch-b"]  # the least urgent: the later arrival
    assert engine.requests["batch-b"].seqs[0].status.name == "WAITING"  # recomputed, not swapped
    finished = []
    while engine.has_unfinished():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert sorted(finished) == ["batch-a", "batch-b", "late0"]


def test_best_effort_waits_for_a_seat_and_keeps_its_share(tiny_model):
    _, running = _seats(tiny_model, deadline=False)
    assert "late0" not in running  # best effort: no seat is taken for it
    engine, running = _seats(tiny_model, deadline=True, num_late=2)
    assert running.count("batch-a") == 1 and len(running) == 2  # best effort keeps its one seat of two
    assert engine.requests["batch-a"].seqs[0].num_preemptions == 0
