"""Random weights drawn on the device (`load_format="dummy"`, as vLLM names it).

For benchmarks of large shapes: writing the `llama3-8b-shape` preset's 16 GB to disk and
reading them back costs minutes. The checkpoint directory still supplies config.json and
the tokenizer; the weights follow make_model's initialisation (unit-variance
embeddings, 1/sqrt(fan_in) projections, norms near 1, LM head scaled to a logit std of
LOGIT_STD), so outputs are as varied as a written random checkpoint's.

A preset's LM head can be wider than make_model's tokenizer (llama3-8b-shape keeps Llama
3's 128,256 rows over a 4,096-token tokenizer); ids past the tokenizer decode to no text,
and greedy decoding on random weights then streams a couple of chunks per request
instead of one per token. `confine_head_to_tokenizer` zeroes those rows: their logits are
exactly 0 while the others spread with a std of about LOGIT_STD, so the argmax stays
inside the tokenizer, and every step still computes the full head.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from . import make_model as mm
from .model import DecoderLayer, LlamaModel, rope_inv_freq
from .model_config import ModelConfig


@torch.no_grad()
def random_model_on_device(
    model_dir: str | Path, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> LlamaModel:
    cfg = ModelConfig.from_dir(model_dir)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = LlamaModel(cfg)
    finally:
        torch.set_default_dtype(previous)
    model = model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    h, heads, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    embed_std = 0.1 if cfg.tie_word_embeddings else 1.0
    model.embed_tokens.weight.normal_(0, embed_std, generator=gen)
    for layer in model.layers:
        assert isinstance(layer, DecoderLayer)  # a ModuleList yields plain Modules to mypy
        attn, mlp = layer.self_attn, layer.mlp
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
            proj.weight.normal_(0, 1 / math.sqrt(h), generator=gen)
            if proj.bias is not None:
                proj.bias.normal_(0, 0.1, generator=gen)
        attn.o_proj.weight.normal_(0, 1 / math.sqrt(heads * hd), generator=gen)
        mlp.down_proj.weight.normal_(0, 1 / math.sqrt(cfg.intermediate_size), generator=gen)
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.normal_(1.0, 0.1, generator=gen)
    model.norm.weight.normal_(1.0, 0.1, generator=gen)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
        model.norm.weight.mul_(mm.LOGIT_STD / (embed_std * math.sqrt(h)))
    else:
        model.lm_head.weight.normal_(0, mm.LOGIT_STD / math.sqrt(h), generator=gen)
    model.rotary.register_buffer("inv_freq", rope_inv_freq(cfg).to(device), persistent=False)
    return model.eval()


@torch.no_grad()
def confine_head_to_tokenizer(model: LlamaModel, model_dir: str | Path) -> LlamaModel:
    from tokenizers import Tokenizer

    visible = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    if model.lm_head.weight is not model.embed_tokens.weight:  # tied rows are the embedding: leave them
        model.lm_head.weight[visible:].zero_()
    return model
