"""lm-eval's `local-completions` model against the real server: a multiple-choice task,
a `loglikelihood_rolling` (perplexity) task and a `generate_until` task, written as YAML
task configs over local JSON data (tests/fixtures/lm_eval/). All three complete, and the
loglikelihoods lm-eval reads from our echo logprobs equal transformers' for the same
tokens (float32, random checkpoint) within 1e-4."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from hf_reference import hf_logits, load_hf
from server_fixtures import MODEL_NAME, running_server

# lm-eval's import and its task set-up take most of a minute on two busy cores.
pytestmark = pytest.mark.slow

TASKS_DIR = Path(__file__).parent / "fixtures" / "lm_eval"
TASKS = ("inferd_mc", "inferd_rolling", "inferd_generate")
TOL = 1e-4


@pytest.fixture(scope="module")
def model_dir(model_factory) -> str:
    return model_factory(preset="tiny", seed=22)


@pytest.fixture(scope="module")
def results(model_dir, tmp_path_factory):
    """One simple_evaluate over the three tasks; (results, the lm-eval model)."""
    mp = pytest.MonkeyPatch()
    cache = tmp_path_factory.mktemp("hf")
    for name, value in (
        ("HF_HUB_OFFLINE", "1"),
        ("HF_DATASETS_OFFLINE", "1"),
        ("HF_DATASETS_CACHE", str(cache)),
        ("HF_HOME", str(cache)),
    ):
        mp.setenv(name, value)
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    configs = []
    for task in TASKS:
        config = yaml.safe_load((TASKS_DIR / f"{task}.yaml").read_text())
        files = config["dataset_kwargs"]["data_files"]
        config["dataset_kwargs"]["data_files"] = {split: str(TASKS_DIR / name) for split, name in files.items()}
        configs.append(config)
    try:
        with running_server(model_dir, dtype="float32") as server:
            lm = LocalCompletionsAPI(
                base_url=f"{server.url}/v1/completions",
                model=MODEL_NAME,
                tokenizer=model_dir,
                tokenizer_backend="huggingface",
                max_length=128,
                num_concurrent=1,
                max_retries=1,
                timeout=60,
            )
            out = lm_eval.simple_evaluate(model=lm, tasks=configs, log_samples=True, random_seed=0)
    finally:
        mp.undo()
    return out, lm


def test_all_three_tasks_complete(results):
    out, _ = results
    metrics = out["results"]
    assert 0.0 <= metrics["inferd_mc"]["acc,none"] <= 1.0
    for name in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        value = metrics["inferd_rolling"][name]
        assert math.isfinite(value) and value > 0, name
    assert metrics["inferd_rolling"]["byte_perplexity,none"] > 1.0
    assert 0.0 <= metrics["inferd_generate"]["exact_match,none"] <= 1.0
    assert len(out["samples"]["inferd_mc"]) == 4
    assert len(out["samples"]["inferd_rolling"]) == 3
    generations = [s["resps"][0][0] for s in out["samples"]["inferd_generate"]]
    assert len(generations) == 3 and all(isinstance(g, str) and "\n" not in g for g in generations)


def _hf_sum(hf, context: list[int], continuation: list[int]) -> float:
    ids = context + continuation
    lp = torch.log_softmax(hf_logits(hf, ids), dim=-1)
    return sum(float(lp[len(context) + j - 1, t]) for j, t in enumerate(continuation))


def test_multiple_choice_loglikelihoods_match_transformers(results, model_dir):
    out, lm = results
    hf = load_hf(model_dir)
    checked = 0
    for sample in out["samples"]["inferd_mc"]:
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"]):
            ll, _ = resp[0]
            context_enc, continuation_enc = lm._encode_pair(context, continuation)
            assert ll == pytest.approx(_hf_sum(hf, context_enc, continuation_enc), abs=TOL), (context, continuation)
            checked += 1
    assert checked == 12


def test_rolling_loglikelihoods_match_transformers(results, model_dir):
    out, lm = results
    hf = load_hf(model_dir)
    for sample in out["samples"]["inferd_rolling"]:
        text = sample["arguments"][0][0]
        tokens = lm.tok_encode(text)
        assert len(tokens) < lm.max_length  # one window: the prefix token, then the document
        ll = sample["resps"][0][0]
        ll = ll[0] if isinstance(ll, (list, tuple)) else ll
        assert ll == pytest.approx(_hf_sum(hf, [lm.prefix_token_id], tokens), abs=TOL), text
