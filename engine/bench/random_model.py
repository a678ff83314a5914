"""A random `make-model` checkpoint built straight on the GPU, for benchmarks.

Writing the `llama3-8b-shape` preset's 16 GB of weights to disk and reading them back
costs minutes; here the checkpoint directory gets everything but the weights
(config.json, tokenizer files: what the engine and transformers read), and the
weights are drawn on the device with make_model's initialisation (unit-variance
embeddings, 1/sqrt(fan_in) projections, norms near 1, LM head scaled to a logit std of
LOGIT_STD). The engine and a transformers model then share that one set of tensors.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from ..config import EngineConfig
from ..llm_engine import LLMEngine
from ..model import make_model as mm
from ..model.dummy_weights import random_model_on_device  # noqa: F401  (benchmarks import it from here)
from ..model.model import LlamaModel


def write_checkpoint_stub(
    out_dir: str | Path, preset: str = "llama3-8b-shape", dtype: str = "bfloat16", **spec: Any
) -> Path:
    """make_model's directory without the weights file; `spec`: more ModelSpec fields
    (arch, tie_word_embeddings, overrides of the preset's shape)."""
    with (
        mock.patch.object(mm, "random_weights", lambda *a, **k: {}),
        mock.patch.object(mm, "save_weights", lambda *a, **k: None),
    ):
        return mm.make_model(out_dir, mm.ModelSpec(preset=preset, dtype=dtype, **spec))


@contextmanager
def engine_loads(model: LlamaModel):
    """Inside, LLMEngine takes `model` instead of reading the checkpoint's weights."""
    with mock.patch("inferd.engine.llm_engine.load_model", lambda *a, **k: model):
        yield


def make_engine(model_dir: str | Path, model: LlamaModel, **config):
    with engine_loads(model):
        return LLMEngine(EngineConfig.from_dict({"model": str(model_dir), **config}))


def hf_model_sharing_weights(model_dir: str | Path, model: LlamaModel):
    """A transformers CausalLM whose parameters are `model`'s own tensors (no copy)."""
    import transformers

    hf_cfg = transformers.AutoConfig.from_pretrained(str(model_dir))
    device = model.embed_tokens.weight.device
    dtype = model.embed_tokens.weight.dtype
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype)
    state = {(n if n.startswith("lm_head") else "model." + n): p for n, p in model.named_parameters()}
    hf.load_state_dict(state, strict=False, assign=True)
    if hf_cfg.tie_word_embeddings:
        hf.tie_weights()
    rotary = hf.model.rotary_emb
    with torch.device(device):  # rebuilt off the meta device: its buffers are not parameters
        hf.model.rotary_emb = type(rotary)(hf.config)
    left = [n for n, t in list(hf.named_parameters()) + list(hf.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"transformers model still has meta tensors: {left[:5]}")
    return hf.eval()
