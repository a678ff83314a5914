"""`inferd bench serve` end to end on the CPU: the tiny model's server at two low rates,
two SLO classes sent with each request, goodput and attainment per class in the JSON,
the PNG written, and the doctor still reading the levels."""

from __future__ import annotations

import json

import pytest

from inferd.agent.cli import main
from inferd.agent.doctor.saturation import sweep_levels
from inferd.engine.request.slo import SloClass, SloClasses

from server_fixtures import one_torch_thread, running_server  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def bench(url: str, out, *extra: str) -> int:
    args = ["bench", "serve", "--url", url, "--rates", "1,2", "--duration", "2", "--max-tokens", "8"]
    # "roomy" targets every request on an idle CPU meets; nothing can meet "impossible"'s 1 us
    args += [
        "--slo-class",
        "roomy:share=0.5,ttft=30,tpot=5,e2e=60",
        "--slo-class",
        "impossible:share=0.5,ttft=0.000001",
    ]
    return main([*args, *extra, "--out", str(out)])


def test_goodput_per_class_against_the_tiny_model(tiny_model, tmp_path):
    """With --send-slo-class, against a server with the same classes: "impossible" demotes
    (served best effort, not refused), so every request completes and the client scores
    its attainment; a server without the classes would refuse them all (400)."""
    out = tmp_path / "goodput"
    classes = SloClasses.build(
        [SloClass.parse("roomy:ttft=30,tpot=5"), SloClass.parse("impossible:ttft=0.001,on_miss=demote")]
    )
    with running_server(tiny_model, slo_classes=classes) as server:
        assert bench(server.url, out, "--send-slo-class") == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["model"] == "tiny" and report["requests"]["token_counts"] == "server /tokenize"
    assert report["config"]["send_slo_class"] is True and report["config"]["dataset"] == "synthetic"
    assert [lv["offered_rate"] for lv in report["levels"]] == [1.0, 2.0]
    for level, num in zip(report["levels"], (2, 4)):
        assert level["num_requests"] == level["completed"] == num and level["failed"] == 0
        assert level["shed"]["count"] == 0 and level["errors"] == []
        assert level["total_output_tokens"] == 8 * num  # synthetic lengths capped by --max-tokens
        roomy, impossible = level["per_class"]["roomy"], level["per_class"]["impossible"]
        assert roomy["num_requests"] == impossible["num_requests"] == num // 2
        assert roomy["attainment"] == roomy["attainment_of_admitted"] == 1.0
        assert roomy["request_goodput"] == pytest.approx(num / 2 / level["duration"])
        assert impossible["attainment"] == 0.0 and impossible["request_goodput"] == 0.0
        assert level["attainment"] == 0.5 and level["request_goodput"] == pytest.approx(roomy["request_goodput"])
        assert 0 < level["median_ttft_ms"] <= level["p99_ttft_ms"]
        assert 0 < level["mean_tpot_ms"] and 0 < level["median_itl_ms"] and 0 < level["mean_e2el_ms"]
    assert [lv.load for lv in sweep_levels(report)] == [1.0, 2.0]
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
