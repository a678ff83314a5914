"""`inferd bench serve` against a running server: a JSON report with a level per
offered load and a PNG plot."""
from __future__ import annotations

import json

import pytest
from server_fixtures import one_torch_thread, running_server  # noqa: F401

from agent.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def test_bench_serve_writes_report_and_plot(tiny_model, tmp_path):
    out = tmp_path / "bench"
    with running_server(tiny_model) as server:
        rc = main(["bench", "serve", "--url", server.url, "--rates", "2,4,8", "--duration", "1.5",
                   "--max-tokens", "8", "--prompt-len", "4,32", "--out", str(out)])
    assert rc == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert [lv["offered_rps"] for lv in report["levels"]] == [2.0, 4.0, 8.0]
    for level in report["levels"]:
        assert level["num_requests"] > 0 and level["num_failed"] == 0
        assert level["output_tokens_per_s"] > 0
        assert 0 < level["ttft_p50"] <= level["ttft_p99"]
        assert 0 < level["itl_p50"] <= level["itl_p99"]
    assert report["model"] == "tiny"
    png = out.with_suffix(".png").read_bytes()
    assert png.startswith(b"\x89PNG")


def test_bench_rejects_bad_rates(tmp_path):
    assert main(["bench", "serve", "--url", "http://127.0.0.1:9", "--rates", "4,2", "--out", str(tmp_path / "x")]) == 2
