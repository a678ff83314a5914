"""`inferd bench serve`'s judgement: per request, did it meet its class's targets; per
level and per class, goodput, attainment, shed and failed requests, latency keys; the
SLO classes' parsing and their assignment to requests."""

from __future__ import annotations

import math
import random

import pytest

from inferd.engine.bench.goodput import RequestRecord, meets, summarize_level
from inferd.engine.bench.slo_classes import (
    SloClass,
    assign_classes,
    check_classes,
    parse_goodput,
    parse_slo_class,
)

INTERACTIVE = SloClass("interactive", 0.5, ttft_s=0.5, tpot_s=0.05)
BATCH = SloClass("batch", 0.3, e2e_s=30.0)
BEST = SloClass("best", 0.2)
CLASSES = [INTERACTIVE, BATCH, BEST]


def ok(cls: str, ttft: float, e2e: float, tokens: int, itls: list[float] | None = None) -> RequestRecord:
    return RequestRecord(cls, prompt_len=10, status=200, ttft=ttft, e2e=e2e, num_output_tokens=tokens, itls=itls or [])


def records() -> list[RequestRecord]:
    return [
        ok("interactive", 0.2, 1.2, 21, [0.05] * 20),  # TPOT exactly 0.05: met
        ok("interactive", 0.6, 1.6, 21, [0.05] * 20),  # TTFT 0.6 > 0.5: missed
        ok("interactive", 0.3, 0.3, 1),  # one token: no TPOT, its target counts as met
        RequestRecord("interactive", 10, status=429, e2e=0.002, error="HTTP 429: busy"),  # shed
        ok("batch", 2.0, 10.0, 5, [2.0] * 4),  # e2e 10 <= 30: met
        RequestRecord("batch", 10, status=500, e2e=0.5, error="HTTP 500: boom"),  # failed
        RequestRecord("batch", 10, status=503, e2e=0.004, error="HTTP 503: draining"),  # shed
        ok("best", 0.1, 0.5, 3, [0.2, 0.2]),  # best effort: completed is good
    ]


def test_each_request_is_judged_on_every_target_of_its_class():
    rs = records()
    assert [meets(r, {c.name: c for c in CLASSES}[r.slo_class]) for r in rs] == [
        True,
        False,
        True,
        False,
        True,
        False,
        False,
        True,
    ]
    assert rs[0].tpot == pytest.approx(0.05) and rs[2].tpot is None and rs[3].tpot is None
    assert rs[3].is_shed and not rs[3].is_completed and not rs[5].is_shed
    assert not meets(ok("interactive", 0.2, 2.2, 21), INTERACTIVE)  # TPOT 0.1 > 0.05
    assert not meets(ok("batch", 1.0, 30.5, 5), BATCH)


def test_level_goodput_attainment_shed_and_failed_on_hand_made_records():
    level = summarize_level(records(), CLASSES, duration_s=2.0)
    assert (level["num_requests"], level["completed"], level["failed"]) == (8, 5, 1)
    assert level["shed"] == {
        "count": 2,
        "by_status": {"429": 1, "503": 1},
        "p50_ms": pytest.approx(3.0),
        "p99_ms": pytest.approx(3.98),
    }
    assert level["request_throughput"] == pytest.approx(5 / 2.0)
    assert level["request_goodput"] == pytest.approx(4 / 2.0)
    assert level["attainment"] == pytest.approx(4 / 8)
    assert level["attainment_of_admitted"] == pytest.approx(4 / 6)
    assert level["total_input_tokens"] == 50 and level["total_output_tokens"] == 21 + 21 + 1 + 5 + 3
    assert level["output_throughput"] == pytest.approx(51 / 2.0)
    # TPOT: the four completed requests with two tokens or more; the one-token reply has none.
    tpots = [0.05, 0.05, 2.0, 0.2]
    assert level["mean_tpot_ms"] == pytest.approx(sum(tpots) / 4 * 1e3)
    assert level["median_tpot_ms"] == pytest.approx(0.125 * 1e3)
    assert level["mean_ttft_ms"] == pytest.approx((0.2 + 0.6 + 0.3 + 2.0 + 0.1) / 5 * 1e3)
    assert level["p99_e2el_ms"] == pytest.approx((1.6 + (10.0 - 1.6) * 0.96) * 1e3)
    assert level["mean_itl_ms"] == pytest.approx((0.05 * 40 + 2.0 * 4 + 0.4) / 46 * 1e3)
    for key in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p90", "p99"):
            assert f"{stat}_{key}_ms" in level

    per = level["per_class"]
    assert list(per) == ["interactive", "batch", "best"]
    inter = per["interactive"]
    assert (inter["num_requests"], inter["completed"], inter["failed"], inter["shed"]["count"]) == (4, 3, 0, 1)
    assert inter["request_goodput"] == pytest.approx(1.0) and inter["attainment"] == pytest.approx(0.5)
    assert inter["attainment_of_admitted"] == pytest.approx(2 / 3)
    batch = per["batch"]
    assert (batch["completed"], batch["failed"], batch["shed"]["by_status"]) == (1, 1, {"503": 1})
    assert batch["attainment"] == pytest.approx(1 / 3) and batch["attainment_of_admitted"] == pytest.approx(1 / 2)
    assert per["best"]["attainment"] == 1.0 and per["best"]["median_tpot_ms"] == pytest.approx(200.0)


def test_without_targets_goodput_is_none_as_in_vllm():
    rs = [ok("default", 0.1, 0.5, 3), RequestRecord("default", status=429, e2e=0.01)]
    level = summarize_level(rs, [SloClass("default", 1.0)], duration_s=1.0)
    assert level["request_goodput"] is None and level["attainment"] is None
    assert level["per_class"]["default"]["request_goodput"] is None
    assert level["completed"] == 1 and level["shed"]["count"] == 1


def test_an_empty_or_all_shed_level_has_no_latencies_and_zero_goodput():
    rs = [RequestRecord("interactive", status=503, e2e=0.01), RequestRecord("batch", status=0, error="ConnectError")]
    level = summarize_level(rs, CLASSES, duration_s=1.0)
    assert level["completed"] == 0 and level["failed"] == 1 and level["request_goodput"] == 0.0
    assert level["attainment"] == 0.0 and level["attainment_of_admitted"] == 0.0
    assert level["mean_ttft_ms"] is None and level["p99_tpot_ms"] is None
    assert level["per_class"]["best"]["num_requests"] == 0 and level["per_class"]["best"]["attainment"] is None
    assert math.isnan(RequestRecord("x").ttft)


# --- SLO classes --------------------------------------------------------------------------
def test_slo_class_parses_targets_in_seconds():
    assert parse_slo_class("chat:share=0.3,ttft=0.5,tpot=0.05,e2e=30") == SloClass("chat", 0.3, 0.5, 0.05, 30.0)
    batch = parse_slo_class("batch:share=0.7")
    assert batch.is_best_effort and batch.targets == {}
    assert parse_slo_class("x:share=1, ttft = 2").targets == {"ttft": 2.0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("chat", "expected NAME:share"),
        ("chat:ttft=0.5", "needs a share"),
        ("chat:share=0.5,latency=2", "unknown key 'latency'"),
        ("chat:share=0.5,ttft=-1", "ttft target of class 'chat' must be a positive number"),
        ("chat:share=0.5,tpot=0", "tpot target"),
        ("chat:share=1.5", "share of class 'chat' must be in"),
        ("chat:share=x", "share must be a number"),
        ("chat:share=0.5,share=0.5", "given twice"),
        ("bad name:share=1", "class name"),
    ],
)
def test_slo_class_refuses_bad_input(text, message):
    with pytest.raises(ValueError, match=message):
        parse_slo_class(text)


def test_goodput_flag_is_vllms_milliseconds_for_the_default_class():
    cls = parse_goodput(["ttft:500", "tpot:50", "e2el:30000"])
    assert cls == SloClass("default", 1.0, ttft_s=0.5, tpot_s=0.05, e2e_s=30.0)
    for bad in (["ttft"], ["latency:5"], ["ttft:-5"], ["ttft:abc"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)


def test_classes_must_cover_every_request_once():
    check_classes([SloClass("a", 0.3), SloClass("b", 0.7)])
    check_classes([SloClass(n, 0.1) for n in "abcdefghij"])  # float sums within tolerance
    with pytest.raises(ValueError, match="sum to 1, they sum to 0.9"):
        check_classes([SloClass("a", 0.3), SloClass("b", 0.6)])
    with pytest.raises(ValueError, match="names must differ"):
        check_classes([SloClass("a", 0.5), SloClass("a", 0.5)])


@pytest.mark.parametrize(
    ("shares", "num", "counts"),
    [
        ((0.3, 0.7), 10, [3, 7]),
        ((0.3, 0.7), 7, [2, 5]),
        ((1 / 3, 1 / 3, 1 / 3), 10, [4, 3, 3]),
        ((0.5, 0.5), 1, [1, 0]),
    ],
)
def test_class_assignment_gives_each_class_its_share(shares, num, counts):
    classes = [SloClass(f"c{i}", s) for i, s in enumerate(shares)]
    names = assign_classes(num, classes, random.Random(0))
    assert len(names) == num
    assert [names.count(c.name) for c in classes] == counts
    assert names == assign_classes(num, classes, random.Random(0))  # seeded


def test_class_assignment_is_shuffled_not_blocked():
    classes = [SloClass("a", 0.5), SloClass("b", 0.5)]
    names = assign_classes(100, classes, random.Random(1))
    assert names.count("a") == 50 and names[:50] != ["a"] * 50
    assert names != assign_classes(100, classes, random.Random(2))
