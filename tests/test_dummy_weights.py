"""load_format=dummy: random weights drawn from the checkpoint's config, no weights file needed."""

from __future__ import annotations

import pytest

from inferd.engine import LLM, EngineConfig, SamplingParams
from inferd.engine.bench.random_model import write_checkpoint_stub


def test_dummy_weights_serve_a_checkpoint_without_weights(tmp_path):
    stub = write_checkpoint_stub(tmp_path / "stub", preset="tiny", dtype="float32")
    assert not list(stub.glob("*.safetensors"))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLM(model=str(stub), kv_cache_bytes=4 << 20)
    llm = LLM(model=str(stub), load_format="dummy", kv_cache_bytes=4 << 20)
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 8
    again = LLM(model=str(stub), load_format="dummy", kv_cache_bytes=4 << 20)  # same seed, same weights
    assert (
        again.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].outputs[0].token_ids
        == out[0].outputs[0].token_ids
    )


def test_dummy_weights_are_checked():
    with pytest.raises(ValueError, match="load_format"):
        EngineConfig(model="x", load_format="random")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineConfig(model="x", load_format="dummy", tensor_parallel_size=2)


def test_dummy_weights_keep_greedy_tokens_inside_the_tokenizer(tmp_path):
    """A preset whose LM head is wider than its tokenizer (as llama3-8b-shape's is)."""
    from unittest import mock

    from inferd.engine.model.make_model import PRESETS

    wide = {**PRESETS["tiny"], "vocab_size": 40000}  # >= 32000: make_model keeps it, as for llama3-8b-shape
    with mock.patch.dict(PRESETS, {"tiny-wide": wide}):
        stub = write_checkpoint_stub(tmp_path / "wide", preset="tiny-wide", dtype="float32")
    llm = LLM(model=str(stub), load_format="dummy", kv_cache_bytes=4 << 20)
    visible = llm.tokenizer.vocab_size
    assert llm.engine.model_config.vocab_size == 40000 > visible
    (result,) = llm.generate([[7, 8, 9, 10]], SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    assert max(result.outputs[0].token_ids) < visible and result.outputs[0].text
