"""Per-SLO-class metrics: a met and a missed request move the right attainment counters and
histograms, the predictor's error lands on its side, shed and demoted requests are
Admission's own counts; end to end, a 429, a 503 and finished requests show on /metrics."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from inferd.engine.request.slo import SloClass, SloClasses
from inferd.engine.scheduling.ttft_predictor import TtftPredictor
from inferd.engine.server.admission import Admission, AdmissionConfig
from inferd.engine.server.errors import ApiError
from inferd.engine.server.slo_metrics import AdmissionCollector, SloLogger
from inferd.engine.stats import FinishedRequestStats

from server_fixtures import MODEL_NAME, metric_value, running_server, scrape

CLASSES = SloClasses.build(
    [SloClass("interactive", ttft_s=0.2, tpot_s=0.05), SloClass("bulk", ttft_s=1.0, on_miss="demote")]
)


def finished(ttft: float, num_generation_tokens: int = 5, decode_time: float = 0.1) -> FinishedRequestStats:
    # queue + prefill is the time to first token; decode over the tokens after the first, TPOT.
    return FinishedRequestStats("stop", 10, num_generation_tokens, ttft + decode_time, ttft / 2, ttft / 2, decode_time)


def exposition(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_met_and_missed_move_their_counters_and_histograms():
    registry = CollectorRegistry()
    logger = SloLogger(registry, CLASSES)
    text = exposition(registry)
    # Every series of a class with a target is there at 0 before its first request.
    assert 'inferd_slo_requests_total{result="met",slo_class="interactive",target="ttft"} 0.0' in text
    assert 'inferd_slo_requests_total{result="missed",slo_class="interactive",target="tpot"} 0.0' in text
    assert 'inferd_slo_requests_total{result="met",slo_class="bulk",target="ttft"} 0.0' in text
    assert 'slo_class="bulk",target="tpot"' not in text  # no TPOT target, no TPOT attainment
    assert 'inferd_slo_requests_total{result="met",slo_class="default"' not in text  # best effort

    logger.record_finished("interactive", finished(0.1, 5, 0.1), None)  # TTFT met, TPOT 0.025 met
    logger.record_finished("interactive", finished(0.4, 3, 0.2), None)  # TTFT missed, TPOT 0.1 missed
    text = exposition(registry)
    for target in ("ttft", "tpot"):
        for result in ("met", "missed"):
            line = f'inferd_slo_requests_total{{result="{result}",slo_class="interactive",target="{target}"}} 1.0'
            assert line in text
    assert 'inferd_slo_time_to_first_token_seconds_bucket{le="0.1",slo_class="interactive"} 1.0' in text
    assert 'inferd_slo_time_to_first_token_seconds_bucket{le="0.5",slo_class="interactive"} 2.0' in text
    assert 'inferd_slo_time_to_first_token_seconds_bucket{le="0.005",slo_class="interactive"} 0.0' in text
    assert 'inferd_slo_time_to_first_token_seconds_bucket{le="1800.0",slo_class="interactive"} 2.0' in text
    assert 'inferd_slo_time_to_first_token_seconds_sum{slo_class="interactive"} 0.5' in text
    assert 'inferd_slo_time_per_output_token_seconds_bucket{le="0.025",slo_class="interactive"} 1.0' in text
    assert 'inferd_slo_time_per_output_token_seconds_count{slo_class="interactive"} 2.0' in text
    assert 'inferd_slo_time_to_first_token_seconds_count{slo_class="bulk"} 0.0' in text


def test_one_token_has_no_tpot_and_best_effort_no_attainment():
    registry = CollectorRegistry()
    logger = SloLogger(registry, SloClasses())
    logger.record_finished("default", finished(3.0, num_generation_tokens=1), None)
    text = exposition(registry)
    assert 'inferd_slo_time_to_first_token_seconds_count{slo_class="default"} 1.0' in text
    assert 'inferd_slo_time_per_output_token_seconds_count{slo_class="default"} 0.0' in text
    assert "inferd_slo_requests_total{" not in text


def test_prediction_error_by_sign():
    registry = CollectorRegistry()
    logger = SloLogger(registry, CLASSES)
    logger.record_finished("interactive", finished(0.1), 0.35)  # predicted 0.25 s late
    logger.record_finished("interactive", finished(0.5), 0.46)  # predicted 0.04 s early
    logger.record_finished("interactive", finished(0.5), None)  # no measured rate: no error
    text = exposition(registry)
    over = 'inferd_slo_ttft_prediction_error_seconds_{}{{direction="over",slo_class="interactive"}} {}'
    under = 'inferd_slo_ttft_prediction_error_seconds_{}{{direction="under",slo_class="interactive"}} {}'
    assert over.format("count", "1.0") in text and under.format("count", "1.0") in text
    bucket = 'inferd_slo_ttft_prediction_error_seconds_bucket{{direction="{}",le="{}",slo_class="interactive"}} {}'
    assert bucket.format("over", "0.3", "1.0") in text and bucket.format("over", "0.2", "0.0") in text
    assert bucket.format("under", "0.05", "1.0") in text and bucket.format("under", "0.025", "0.0") in text


def test_shed_and_demoted_are_admissions_counts():
    predictor = TtftPredictor()
    predictor.prefill_tokens_per_s = 1000.0
    admission = Admission(AdmissionConfig(max_num_queued_reqs=30), predictor)
    registry = CollectorRegistry()
    registry.register(AdmissionCollector(admission, CLASSES))
    text = exposition(registry)
    for name in ("interactive", "bulk", "default"):
        for reason in ("slo_unattainable", "max_num_queued_reqs", "max_num_queued_tokens"):
            assert f'inferd_slo_requests_shed_total{{reason="{reason}",slo_class="{name}"}} 0.0' in text
        assert f'inferd_slo_requests_demoted_total{{slo_class="{name}"}} 0.0' in text
    assert 'inferd_slo_class_target_seconds{slo_class="interactive",target="tpot"} 0.05' in text

    for _ in range(5):
        admission.enter(0, 1.0, 1000, 1)  # 5 s of prefill ahead
    with pytest.raises(ApiError):
        admission.check(CLASSES.get("interactive"), 0, 2.0, 10, 1)
    assert admission.check(CLASSES.get("bulk"), 0, 2.0, 10, 1).demoted
    with pytest.raises(ApiError):
        admission.check(CLASSES.get("bulk"), 0, None, 10, 40)  # 45 sequences > 30
    text = exposition(registry)
    assert 'inferd_slo_requests_shed_total{reason="slo_unattainable",slo_class="interactive"} 1.0' in text
    assert 'inferd_slo_requests_shed_total{reason="max_num_queued_reqs",slo_class="bulk"} 1.0' in text
    assert 'inferd_slo_requests_shed_total{reason="slo_unattainable",slo_class="bulk"} 0.0' in text
    assert 'inferd_slo_requests_demoted_total{slo_class="bulk"} 1.0' in text
    assert 'inferd_slo_requests_demoted_total{slo_class="interactive"} 0.0' in text


@pytest.mark.slow
def test_server_exports_attainment_shedding_and_prediction_error(tiny_model):
    classes = SloClasses.build(
        [SloClass("interactive", ttft_s=60.0), SloClass("strict", ttft_s=0.001), SloClass("batch")],
        default_class="batch",
    )
    with running_server(tiny_model, slo_classes=classes, admission=AdmissionConfig(max_num_queued_reqs=4)) as server:
        url = f"{server.url}/v1/completions"
        body = {"model": MODEL_NAME, "prompt": "hello " * 20, "max_tokens": 3, "ignore_eos": True, "temperature": 0}
        for _ in range(2):  # the second is admitted with a prediction: the first measured the rate
            r = httpx.post(url, json=body | {"slo_class": "interactive"}, timeout=60)
            assert r.status_code == 200
        r = httpx.post(url, json=body | {"stream": True}, timeout=60)  # the default class, streamed
        assert r.status_code == 200
        server.app.state.engine.ttft_predictor.prefill_tokens_per_s = 1.0  # idle: no step updates it
        r = httpx.post(url, json=body | {"slo_class": "strict"}, timeout=60)
        assert r.status_code == 429
        r = httpx.post(url, json=body | {"n": 5}, timeout=60)
        assert r.status_code == 503
        text = scrape(server.url)
    met = {"slo_class": "interactive", "target": "ttft", "result": "met"}
    assert metric_value(text, "inferd_slo_requests_total", met) == 2
    assert metric_value(text, "inferd_slo_requests_total", met | {"result": "missed"}) == 0
    assert metric_value(text, "inferd_slo_time_to_first_token_seconds_count", {"slo_class": "interactive"}) == 2
    assert metric_value(text, "inferd_slo_time_to_first_token_seconds_count", {"slo_class": "batch"}) == 1
    assert metric_value(text, "inferd_slo_time_per_output_token_seconds_count", {"slo_class": "batch"}) == 1
    assert metric_value(text, "inferd_slo_ttft_prediction_error_seconds_count", {"slo_class": "interactive"}) >= 1
    shed = "inferd_slo_requests_shed_total"
    assert metric_value(text, shed, {"slo_class": "strict", "reason": "slo_unattainable"}) == 1
    assert metric_value(text, shed, {"slo_class": "batch", "reason": "max_num_queued_reqs"}) == 1
    assert metric_value(text, shed, {"slo_class": "interactive"}) == 0
