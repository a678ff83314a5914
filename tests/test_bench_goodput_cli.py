"""`inferd bench serve`'s options: each bad value is an argparse error naming its flag
(exit status 2) before any server is contacted; good ones make the run's config and
its levels."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.agent.cli import command_parser, main
from inferd.engine.bench.serve_levels import plan_levels
from inferd.engine.bench.serve_options import config_from_args
from inferd.engine.bench.slo_classes import SloClass

FIXTURES = Path(__file__).parent / "fixtures" / "bench_serve"
NOWHERE = ["--url", "http://127.0.0.1:9"]  # nothing listens there: a run that got past its options would fail


def refused(capsys, tmp_path, *options: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "serve", *NOWHERE, "--out", str(tmp_path / "x"), *options])
    assert exit_info.value.code == 2
    assert not (tmp_path / "x.json").exists()
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--slo-class", "a:share=0.3,ttft=0.5", "--slo-class", "b:share=0.5"],
            "argument --slo-class: shares must sum to 1",
        ),
        (["--slo-class", "a:share=0.5", "--slo-class", "a:share=0.5"], "argument --slo-class: class names must differ"),
        (["--slo-class", "a:share=1,ttft=-0.5"], "argument --slo-class: ttft target of class 'a' must be a positive"),
        (["--slo-class", "a:share=1,ttft=0.5,speed=3"], "argument --slo-class: unknown key 'speed'"),
        (["--goodput", "ttft:-100"], "argument --goodput: ttft target must be a positive"),
        (["--goodput", "latency:100"], "argument --goodput: expected KEY:MS"),
        (["--goodput", "ttft:100", "--slo-class", "a:share=1"], "argument --goodput: sets the targets of the class"),
        (["--arrival", "bursty"], "argument --arrival: invalid choice: 'bursty'"),
        (["--arrival", "trace"], "argument --arrival: trace needs --trace PATH"),
        (["--burstiness", "0.5"], "argument --burstiness: goes with --arrival gamma"),
        (["--arrival", "gamma", "--burstiness", "0"], "argument --burstiness: must be > 0"),
        (["--trace", str(FIXTURES / "trace.jsonl")], "argument --trace: goes with --arrival trace"),
        (["--dataset", "/no/such/sharegpt.json"], "argument --dataset: cannot read '/no/such/sharegpt.json'"),
        (["--dataset", str(FIXTURES / "trace.jsonl")], "argument --dataset: "),
        (["--prompt-len", "4,32"], "argument --prompt-len: goes with --dataset uniform"),
        (["--dataset", "uniform", "--prompt-len", "32,4"], "argument --prompt-len: need 1 <= MIN <= MAX"),
        (["--max-tokens", "1"], "argument --max-tokens: must be >= 2"),
        (["--rates", "4,2"], "argument --rates: rates must rise"),
        (["--rates", "0,2"], "argument --rates: rates must be positive"),
        (["--duration", "-1"], "argument --duration: must be > 0"),
        (["--sampled-share", "1.5"], "argument --sampled-share: must be in [0, 1]"),
        (["--top-p", "0"], "argument --top-p: top_p must be in (0, 1]"),
    ],
)
def test_bad_options_are_argparse_errors_naming_the_flag(capsys, tmp_path, options, message):
    assert message in refused(capsys, tmp_path, *options)


def test_a_trace_class_must_be_a_defined_class(capsys, tmp_path):
    err = refused(
        capsys,
        tmp_path,
        "--arrival",
        "trace",
        "--trace",
        str(FIXTURES / "trace.jsonl"),
        "--slo-class",
        "interactive:share=1",
    )
    assert "argument --trace: class batch is not one of interactive" in err
    err = refused(capsys, tmp_path, "--arrival", "trace", "--trace", str(FIXTURES / "trace.jsonl"), "--duration", "5")
    assert "argument --duration: does not apply to --arrival trace" in err


def config(*options: str):
    args = command_parser("bench").parse_args(["serve", *NOWHERE, *options])
    return config_from_args(args)


def test_defaults_and_vllms_goodput_flag():
    cfg = config()
    assert cfg.rates == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0] and cfg.duration_s == 20.0
    assert (cfg.dataset, cfg.arrival, cfg.max_tokens, cfg.send_slo_class) == ("synthetic", "poisson", None, False)
    assert cfg.classes == [SloClass("default", 1.0)] and not cfg.sampling.is_sampled
    cfg = config("--goodput", "ttft:500", "tpot:50", "--dataset", "uniform")
    assert cfg.classes == [SloClass("default", 1.0, ttft_s=0.5, tpot_s=0.05)] and cfg.uniform_output_len == 64
    cfg = config("--temperature", "0.8", "--sampled-share", "0.25", "--top-k", "40")
    params = cfg.sampling.request_params(8)
    assert sum(p["temperature"] > 0 for p in params) == 2 and max(p.get("top_k", 0) for p in params) == 40
    assert config("--top-p", "0.9").sampling.mix == 1.0  # a sampling option alone samples every request


def test_levels_follow_rates_duration_and_arrival():
    plans = plan_levels(config("--rates", "2,4", "--duration", "5"), None)
    assert [(p.offered_rate, len(p.times)) for p in plans] == [(2.0, 10), (4.0, 20)]
    assert all(0 <= t < 5 for p in plans for t in p.times)
    gamma = plan_levels(config("--rates", "2", "--duration", "5", "--arrival", "gamma", "--burstiness", "0.5"), None)
    assert len(gamma[0].times) == 10 and gamma[0].times[-1] == pytest.approx(5.0)


def test_a_trace_is_one_level_at_its_own_timing_or_time_scaled_to_each_rate():
    from inferd.engine.bench.arrivals import read_trace

    trace = read_trace(FIXTURES / "trace.jsonl")
    (own,) = plan_levels(config("--arrival", "trace", "--trace", str(FIXTURES / "trace.jsonl")), trace)
    assert own.offered_rate == pytest.approx(2.5) and own.times == [0.0, 0.25, 0.5, 1.5, 2.0] and own.trace is trace
    scaled = plan_levels(
        config("--arrival", "trace", "--trace", str(FIXTURES / "trace.jsonl"), "--rates", "5,10"), trace
    )
    assert [p.offered_rate for p in scaled] == [5.0, 10.0] and scaled[1].times[-1] == pytest.approx(0.5)
