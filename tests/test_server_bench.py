"""`inferd bench serve` against a running server: a JSON report with a level per
offered load and a PNG plot. `inferd bench burst`: the offline engine and the server on
the same burst, every request's token count checked, errors counted."""

from __future__ import annotations

import json
import math

import pytest

from inferd.agent.cli import main

from server_fixtures import one_torch_thread, running_server  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def test_bench_serve_writes_report_and_plot(tiny_model, tmp_path):
    out = tmp_path / "bench"
    with running_server(tiny_model) as server:
        rc = main(
            [
                "bench",
                "serve",
                "--url",
                server.url,
                "--rates",
                "2,4,8",
                "--duration",
                "1.5",
                "--max-tokens",
                "8",
                "--dataset",
                "uniform",
                "--prompt-len",
                "4,32",
                "--out",
                str(out),
            ]
        )
    assert rc == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert [lv["offered_rate"] for lv in report["levels"]] == [2.0, 4.0, 8.0]
    for level in report["levels"]:
        assert level["num_requests"] > 0 and level["failed"] == 0
        assert level["completed"] == level["num_requests"] and level["total_output_tokens"] == 8 * level["completed"]
        assert level["output_throughput"] > 0
        assert 0 < level["median_ttft_ms"] <= level["p99_ttft_ms"]
        assert 0 < level["median_itl_ms"] <= level["p99_itl_ms"]
        # what `inferd doctor --sweep` reads
        assert level["offered_rps"] == level["offered_rate"] and level["ttft_p99"] == level["p99_ttft_ms"] / 1e3
    assert report["model"] == "tiny"
    png = out.with_suffix(".png").read_bytes()
    assert png.startswith(b"\x89PNG")


def test_bench_rejects_bad_rates(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "serve", "--url", "http://127.0.0.1:9", "--rates", "4,2", "--out", str(tmp_path / "x")])
    assert exit_info.value.code == 2


# --- `inferd bench burst`: the server against the offline engine ---------------------------
def _phases(report: dict) -> dict[str, dict]:
    return {ph["phase"]: ph for ph in report["phases"]}


def test_bench_burst_offline_and_server_every_request_exact(tmp_path):
    out = tmp_path / "burst.json"
    rc = main(
        [
            "bench",
            "burst",
            "--preset",
            "tiny",
            "--num-requests",
            "8",
            "--prompt-len",
            "16",
            "--output-len",
            "8",
            "--warmup-requests",
            "2",
            "--max-num-seqs",
            "8",
            "--block-size",
            "8",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["machine"]["cpus"] >= 1 and "gpu" in report["machine"]
    assert report["versions"]["python"] and report["versions"]["torch"]
    assert report["options"]["burst"]["num_requests"] == 8
    assert report["options"]["engine"] == {"max_num_seqs": 8, "block_size": 8, "load_format": "dummy"}
    phases = _phases(report)
    assert list(phases) == ["offline", "server non-stream", "server stream"]
    for ph in phases.values():
        assert ph["num_requests"] == ph["num_ok"] == 8
        assert ph["num_errors"] == 0 and ph["num_wrong_token_count"] == 0 and ph["errors"] == []
        assert ph["tokens"] == [8] * 8 and ph["output_tokens"] == 64
        assert 0 < ph["ratio_to_offline"] < math.inf and ph["output_tok_s"] > 0
    assert 0 < phases["offline"]["ttft_p50"] <= phases["offline"]["ttft_p99"] <= phases["offline"]["prefill_s"]
    stream, plain = phases["server stream"], phases["server non-stream"]
    assert 0 < stream["ttft_p50"] <= stream["ttft_p99"] <= stream["prefill_s"]
    assert stream["mean_chunks"] >= 1
    assert plain["ttft_p50"] is None and 0 < plain["e2e_p50"] <= plain["e2e_p99"]
    for ph in (stream, plain):
        assert ph["client_cpu_s"] >= 0


def test_bench_burst_counts_errors_against_a_running_server(tiny_model, tmp_path):
    out = tmp_path / "burst.json"
    with running_server(tiny_model) as server:
        # 16 + 4000 tokens is past the tiny model's 2048: every request is refused.
        rc = main(
            [
                "bench",
                "burst",
                "--url",
                server.url,
                "--num-requests",
                "4",
                "--prompt-len",
                "16",
                "--output-len",
                "4000",
                "--stream",
                "yes",
                "--warmup-requests",
                "0",
                "--out",
                str(out),
            ]
        )
    assert rc == 1
    (stream,) = json.loads(out.read_text())["phases"]
    assert stream["phase"] == "server stream" and stream["ratio_to_offline"] is None
    assert stream["num_errors"] == 4 and stream["num_ok"] == 0
    assert stream["errors"] and stream["errors"][0].startswith("HTTP 400")


def test_burst_phases_share_prompts_but_not_their_first_block():
    from inferd.engine.bench.burst import for_phase, make_prompts

    base = make_prompts(512, 4, 16, seed=3)
    assert base == make_prompts(512, 4, 16, seed=3)
    phases = [for_phase(base, k, 512) for k in range(3)]
    assert phases[0] == base
    for a, b in zip(phases[1], phases[2]):
        assert a[1:] == b[1:] and a[0] != b[0] and 5 <= min(a) and max(a) < 512


def test_burst_engine_options_reach_inferd_serve_as_given():
    import argparse

    from inferd.engine.bench.burst import server_flags
    from inferd.engine.server.cli import add_arguments

    options = {
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
        "enable_prefix_caching": False,
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.85,
    }
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(server_flags(options))
    assert {name: getattr(args, name) for name in options} == options


def test_burst_config_rejects_bad_values():
    from inferd.engine.bench.burst import BurstConfig

    with pytest.raises(ValueError, match="output_len"):
        BurstConfig(output_len=0)
    with pytest.raises(ValueError, match="stream"):
        BurstConfig(stream="sometimes")


def test_bench_burst_sampled_phases_against_greedy_in_the_same_run(tmp_path):
    """With sampling flags each side runs a greedy and a sampled burst; the sampled
    phases carry their ratio to the same side's greedy phase."""
    out = tmp_path / "burst.json"
    args = ["bench", "burst", "--preset", "tiny", "--num-requests", "6", "--prompt-len", "16", "--output-len", "6"]
    args += ["--warmup-requests", "1", "--max-num-seqs", "8", "--block-size", "8", "--stream", "no"]
    args += ["--temperature", "0.7", "--top-p", "0.9", "--top-k", "50", "--min-p", "0.05"]
    args += ["--seed-share", "0.5", "--mix", "0.5", "--out", str(out)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    phases = _phases(report)
    assert list(phases) == ["offline", "offline sampled", "server non-stream", "server non-stream sampled"]
    assert report["options"]["sampling"]["mix"] == 0.5
    for ph in phases.values():
        assert ph["num_ok"] == 6 and ph["tokens"] == [6] * 6
    for name in ("offline", "server non-stream"):
        assert phases[name]["ratio_to_greedy"] is None
        sampled = phases[name + " sampled"]
        assert sampled["ratio_to_greedy"] == pytest.approx(sampled["output_tok_s"] / phases[name]["output_tok_s"])


def test_burst_sampling_mix_spreads_sampled_and_seeded_requests():
    from inferd.engine.bench.burst_client import completion_body
    from inferd.engine.bench.burst_sampling import SamplingMix

    params = SamplingMix(temperature=0.7, top_p=0.9, top_k=50, seed_share=0.5, mix=0.5).request_params(8)
    sampled = [p for p in params if p["temperature"] > 0]
    assert len(sampled) == 4 and sum("seed" in p for p in sampled) == 2
    assert all(p == {"temperature": 0.0} for p in params if p not in sampled)
    assert {k: v for k, v in sampled[0].items() if k != "seed"} == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 50,
        "min_p": 0.0,
    }
    assert SamplingMix(top_p=0.9).request_params(2)[0]["temperature"] == 1.0  # sampling without a temperature
    assert not SamplingMix().is_sampled and SamplingMix(mix=0.5).is_sampled
    assert SamplingMix(logprobs=5).request_params(1) == [
        {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "logprobs": 5}
    ]
    body = json.loads(completion_body("m", [5, 6], 4, False, sampled[0]))
    assert body["temperature"] == 0.7 and body["top_k"] == 50 and body["ignore_eos"] is True
    for bad in (
        dict(top_p=0.0),
        dict(mix=1.5),
        dict(seed_share=-0.1),
        dict(temperature=-1.0),
        dict(top_k=-2),
        dict(logprobs=21),
    ):
        with pytest.raises(ValueError):
            SamplingMix(**bad)
