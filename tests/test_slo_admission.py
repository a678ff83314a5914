"""Admission control: a deadline request predicted to miss its TTFT target by more than
the margin is refused with 429, Retry-After and an OpenAI-shaped error naming the class
and the predicted wait, or demoted for an on_miss=demote class; the queue caps answer
503; below saturation, without a measured rate, and for best effort nothing is shed.
End to end on CPU: two classes under overload."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from inferd.engine.request.slo import SloClass, SloClasses
from inferd.engine.scheduling.ttft_predictor import TtftPredictor
from inferd.engine.server.admission import Admission, AdmissionConfig
from inferd.engine.server.errors import ApiError

from server_fixtures import MODEL_NAME, running_server

INTERACTIVE = SloClass("interactive", ttft_s=1.0)
DEMOTABLE = SloClass("bulk", ttft_s=1.0, on_miss="demote")
BATCH = SloClass("batch")


def admission(rate: float | None = 1000.0, **config) -> Admission:
    predictor = TtftPredictor()
    predictor.prefill_tokens_per_s = rate
    return Admission(AdmissionConfig(**config), predictor)


def test_the_default_margin_refuses_past_the_target():
    a = admission()
    for _ in range(9):
        a.enter(0, 10.0, 100, 1)  # 900 tokens ahead + 100: 1.0 s, just the target
    assert a.check(INTERACTIVE, 0, 10.0, 100, 1).predicted_ttft_s == pytest.approx(1.0)
    a.enter(0, 10.0, 100, 1)  # 1.1 s
    with pytest.raises(ApiError):
        a.check(INTERACTIVE, 0, 10.0, 100, 1)


def test_below_saturation_nothing_is_shed():
    a = admission()
    for _ in range(5):
        a.enter(0, 10.0, 100, 1)  # 500 tokens ahead: 0.5 s, + 100 own: 0.6 s < 1 s
    d = a.check(INTERACTIVE, 0, 10.0, 100, 1)
    assert not d.demoted and d.predicted_ttft_s == pytest.approx(0.6)
    assert not a.shed


def test_refused_past_the_margin_with_429_retry_after_and_the_class():
    a = admission(slo_admission_margin=1.0)
    for _ in range(20):
        a.enter(0, 10.0, 100, 1)  # 2,000 tokens ahead + 100: 2.1 s > 2 x 1 s
    with pytest.raises(ApiError) as err:
        a.check(INTERACTIVE, 0, 10.0, 100, 1)
    e = err.value
    assert e.status == 429 and e.param == "slo_class" and e.code == "slo_unattainable"
    assert "'interactive'" in e.message and "2.100 s" in e.message
    assert e.headers == {"Retry-After": "2"}  # ceil(2.1 - 1.0)
    assert a.shed == {("interactive", "deadline"): 1}
    # Within the margin (2.1 s <= 3 x 1 s) it is admitted.
    assert not admission_with(a, slo_admission_margin=2.0).check(INTERACTIVE, 0, 10.0, 100, 1).demoted


def admission_with(a: Admission, **config) -> Admission:
    return Admission(AdmissionConfig(**config), a.predictor, a.queued)


def test_only_what_the_scheduler_serves_first_counts_as_ahead():
    a = admission()
    a.enter(0, 20.0, 5000, 1)  # a later deadline: behind
    a.enter(0, None, 5000, 1)  # best effort at the same priority: behind
    a.enter(-5, None, 5000, 1)  # best effort of any priority: behind every deadline request
    a.enter(1, 5.0, 5000, 1)  # a less urgent priority: behind
    started = a.enter(-1, 1.0, 5000, 1)
    a.started(started)  # already past its first token
    a.enter(-1, 30.0, 300, 2)  # more urgent priority: ahead
    a.enter(0, 10.0, 200, 1)  # same deadline: ahead
    assert a.ahead(0, 10.0) == (500, 3)
    assert a.check(INTERACTIVE, 0, 10.0, 100, 1).predicted_ttft_s == pytest.approx(0.6)


def test_the_wait_for_a_seat_counts_when_deadline_sequences_hold_every_seat_they_may():
    a = admission(slo_admission_margin=1.0)
    a.predictor.seat_s = 4.0  # a finished request held its seat 4 s: 4 seats free one a second
    for _ in range(3):
        a.started(a.enter(0, 1.0, 100, 1))  # decoding deadline sequences
    for _ in range(6):
        a.started(a.enter(0, None, 100, 1))  # decoding best effort: its seats are not counted
    a.enter(0, 5.0, 100, 1)  # a deadline request ahead, waiting for its first token
    # 3 decoding + 1 ahead + 1 own = 5 > 4 seats: one short, 1 s; prefill 200 tokens: 0.2 s.
    assert a.check(INTERACTIVE, 0, 10.0, 100, 1, deadline_seats=4).predicted_ttft_s == pytest.approx(1.2)
    assert a.check(INTERACTIVE, 0, 10.0, 100, 1, deadline_seats=5).predicted_ttft_s == pytest.approx(0.2)
    assert a.check(INTERACTIVE, 0, 10.0, 100, 1).predicted_ttft_s == pytest.approx(0.2)  # no seat limit given
    with pytest.raises(ApiError) as err:  # 3 short of 2 seats: 6 s + 0.2 s > 2 x 1 s
        a.check(INTERACTIVE, 0, 10.0, 100, 1, deadline_seats=2)
    assert err.value.status == 429 and "6.200 s" in err.value.message
    a.predictor.seat_s = None  # nothing finished yet: no seat wait is assumed
    assert a.check(INTERACTIVE, 0, 10.0, 100, 1, deadline_seats=2).predicted_ttft_s == pytest.approx(0.2)


def test_demote_instead_of_refusing():
    a = admission()
    a.enter(0, 1.0, 5000, 1)
    d = a.check(DEMOTABLE, 0, 2.0, 100, 1)
    assert d.demoted and d.predicted_ttft_s == pytest.approx(5.1)
    assert a.demoted == {"bulk": 1} and not a.shed


def test_no_rate_measured_or_best_effort_is_never_shed_by_deadline():
    a = admission(rate=None)
    a.enter(0, 1.0, 10**6, 1)
    assert a.check(INTERACTIVE, 0, 2.0, 100, 1).predicted_ttft_s is None
    b = admission(rate=1.0)
    b.enter(0, 1.0, 10**6, 1)
    assert not b.check(BATCH, 0, None, 100, 1).demoted


def test_queue_caps_answer_503():
    a = admission(max_num_queued_reqs=3, max_num_queued_tokens=1000)
    t = a.enter(0, None, 600, 2)
    with pytest.raises(ApiError) as err:
        a.check(BATCH, 0, None, 10, 2)  # 2 + 2 sequences > 3
    assert err.value.status == 503 and err.value.code == "queue_full" and "--max-num-queued-reqs" in err.value.message
    assert err.value.headers == {"Retry-After": "1"}
    with pytest.raises(ApiError) as err:
        a.check(BATCH, 0, None, 500, 1)  # 600 + 500 tokens > 1000
    assert "--max-num-queued-tokens" in err.value.message
    a.started(t)  # its prompt is computed: its tokens no longer wait
    assert not a.check(BATCH, 0, None, 500, 1).demoted
    a.leave(t)
    assert a.num_queued_seqs == 0
    assert a.shed == {("batch", "max_num_queued_reqs"): 1, ("batch", "max_num_queued_tokens"): 1}


@pytest.mark.parametrize(
    "values, fragment",
    [
        ({"slo_admission_margin": -0.5}, "slo_admission_margin"),
        ({"max_num_queued_reqs": -1}, "max_num_queued_reqs"),
        ({"max_num_queued_tokens": 1.5}, "max_num_queued_tokens must be an integer"),
    ],
)
def test_bad_admission_config(values, fragment):
    with pytest.raises(ValueError, match=fragment):
        AdmissionConfig(**values)


# --- end to end ----------------------------------------------------------------------------


def _classes() -> SloClasses:
    return SloClasses.build(
        [SloClass("interactive", ttft_s=30.0), SloClass("strict", ttft_s=0.01), SloClass("batch")],
        default_class="batch",
    )


@pytest.mark.slow
def test_two_classes_under_overload(tiny_model):
    """Twelve batch streams fill two sequence slots; three interactive requests sent after
    them are admitted ahead of the waiting batch ones and meet a generous TTFT target,
    every batch request still finishes, and nothing is shed. Then, with the measured rate
    made tiny on the idle server, a strict-class request is refused with 429."""
    with running_server(tiny_model, max_num_seqs=2, slo_classes=_classes()) as server:
        url = f"{server.url}/v1/completions"
        firsts: dict[str, float] = {}
        statuses: dict[str, int] = {}
        errors: list[str] = []

        def send(name: str, slo_class: str, max_tokens: int) -> None:
            body = {
                "model": MODEL_NAME,
                "prompt": f"{name} " * 20,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            }
            start = time.monotonic()
            try:
                with httpx.stream("POST", url, json=body, headers={"X-SLO-Class": slo_class}, timeout=120) as r:
                    statuses[name] = r.status_code
                    lines = r.iter_lines()
                    next(line for line in lines if line.startswith("data: {"))
                    firsts[name] = time.monotonic()
                    assert [line for line in lines if line][-1] == "data: [DONE]"
                    firsts[name + ":ttft"] = firsts[name] - start
            except Exception as exc:
                errors.append(f"{name}: {exc!r}")

        live = server.app.state.engine
        threads = [threading.Thread(target=send, args=(f"b{i}", "batch", 48)) for i in range(12)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while live.num_live_requests < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        interactive = [threading.Thread(target=send, args=(f"i{i}", "interactive", 4)) for i in range(3)]
        for t in interactive:
            t.start()
        for t in threads + interactive:
            t.join(120)
        assert not errors, errors
        assert set(statuses.values()) == {200} and len(statuses) == 15  # nothing shed
        last_batch_first = max(firsts[f"b{i}"] for i in range(12))
        for i in range(3):
            assert firsts[f"i{i}"] < last_batch_first  # admitted ahead of waiting batch requests
            assert firsts[f"i{i}:ttft"] < 30.0

        live.ttft_predictor.prefill_tokens_per_s = 1.0  # idle: no step updates it
        body = {"model": MODEL_NAME, "prompt": "hello " * 20, "max_tokens": 2, "slo_class": "strict"}
        start = time.monotonic()
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 429 and time.monotonic() - start < 5
        assert int(r.headers["Retry-After"]) >= 1
        err = r.json()["error"]
        assert err["code"] == "slo_unattainable" and err["param"] == "slo_class" and "'strict'" in err["message"]
        # An unknown class is a 400 naming the field, and the server still serves.
        r = httpx.post(url, json=body | {"slo_class": "gold"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "slo_class"
        r = httpx.post(url, json=body | {"slo_class": "batch"}, timeout=30)
        assert r.status_code == 200


def test_a_non_streaming_request_leaves_the_prefill_queue_at_its_first_token(tiny_model):
    """Admission counts a request's prompt as waiting until its first token: the engine
    reports it in its step statistics, so a non-streaming request, whose output comes only
    at the end, stops counting then too."""
    with running_server(tiny_model, slo_classes=_classes()) as server:
        admission = server.app.state.admission
        body = {"model": MODEL_NAME, "prompt": "hi " * 8, "max_tokens": 400, "ignore_eos": True, "temperature": 0}
        result: dict[str, int] = {}

        def send() -> None:
            result["status"] = httpx.post(
                f"{server.url}/v1/completions", json=body | {"slo_class": "interactive"}, timeout=120
            ).status_code

        thread = threading.Thread(target=send)
        thread.start()
        seen: set[bool] = set()
        while thread.is_alive():
            seen |= {q.started for q in list(admission.queued.values())}
            time.sleep(0.002)
        thread.join()
        assert result == {"status": 200}
        assert True in seen  # decoding, and no longer counted as waiting for prefill
        assert not admission.queued


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--slo-admission-margin", "-1"], "--slo-admission-margin"),
        (["--max-num-queued-reqs", "-2"], "--max-num-queued-reqs"),
        (["--max-num-queued-tokens", "-2"], "--max-num-queued-tokens"),
    ],
)
def test_bad_admission_flags_are_startup_errors_naming_the_flag(argv, flag):
    import argparse

    from inferd.engine.server.cli import add_arguments, admission_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match=f"^{flag}: "):
        admission_from_args(parser.parse_args(argv))
