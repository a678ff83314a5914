"""The sampling-mixes benchmark (engine/bench/sampling_mixes.py) on the CPU, tiny preset:
every mix runs on one engine and is reported against greedy bursts of the same run."""

from __future__ import annotations

import json

from inferd.engine.bench import sampling_mixes


def test_every_mix_is_measured_against_greedy_of_the_same_run(tmp_path):
    argv = ["--out", str(tmp_path), "--preset", "tiny", "--device", "cpu", "--num-requests", "4"]
    assert sampling_mixes.main([*argv, "--prompt-len", "16", "--output-len", "4"]) == 0
    report = json.loads((tmp_path / "sampling_mixes.json").read_text())
    names = [run["name"] for run in report["runs"]]
    assert set(sampling_mixes.mixes(4)) <= set(names)
    assert names.count("greedy") == 1 and "greedy (middle)" in names and "greedy (end)" in names
    greedy = [run["tok_s"] for run in report["runs"] if run["name"].startswith("greedy")]
    for run in report["runs"]:
        assert run["tok_s"] > 0
        if run["requests"] == 4:
            assert run["x_greedy"] == run["tok_s"] / (sum(greedy) / len(greedy))
    assert report["batch1_top_p_x_greedy"] > 0
    steady = report["batch1_steady_step_ms"]
    assert set(steady) == set(sampling_mixes.STEADY) and all(ms > 0 for ms in steady.values())
    assert report["batch1_steady_top_p_x_greedy"] == steady["greedy"] / steady["top_p 0.9 (temperature 1.0)"]
    assert all(run["mode"] == "fast" for run in report["runs"])


def test_the_mixes_ask_for_what_their_names_say():
    mixes = sampling_mixes.mixes(8)
    half = mixes["half greedy, half temperature 1.0"]
    assert sum(p["temperature"] == 0.0 for p in half) == 4
    assert [p["seed"] for p in mixes["every row seeded (temperature 1.0)"]] == list(range(8))
    assert all(p["logprobs"] == 5 and p["temperature"] == 0.0 for p in mixes["logprobs 5 (greedy)"])
    every = mixes["every kind of row"]
    assert {"seed", "logprobs", "frequency_penalty", "logit_bias", "top_k"} <= {k for p in every for k in p}
