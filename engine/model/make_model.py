"""`inferd make-model`: write a randomly initialised Llama-family checkpoint.

The output is a Hugging Face checkpoint directory (config.json, safetensors,
tokenizer.json with a byte-level BPE trained here on a small embedded text,
tokenizer_config.json with a chat template), so the engine, transformers and the
tests all run anywhere without a download. `--chat-template-family` picks the chat
template and its special tokens (engine/model/chat_templates.py): the default Llama 3 header
format, or Llama 3.1, Hermes (Qwen 2.5) or Mistral with their tool-calling markup.

Initialisation: the usual std=0.02 makes a small random model repeat one token, and
then an equality test against a reference proves little. Here embeddings have unit
variance, every projection has std 1/sqrt(fan_in) (activations stay O(1) through the
layers), and the LM head is scaled so logits have a std of about 4: greedy outputs
vary with context and top-1/top-2 gaps sit far above float32 rounding noise.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .chat_templates import CHAT_FAMILIES
from .progress import Progress

PRESETS: dict[str, dict] = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=2048,
    ),
    "small": dict(
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=2048,
        max_position_embeddings=4096,
    ),
    "llama3-8b-shape": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
    ),
}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CHAT_TEMPLATE = CHAT_FAMILIES["llama3"].template
LOGIT_STD = 4.0

CORPUS = """
The engine keeps the key and value cache in fixed-size blocks, and every sequence reaches its
blocks through a block table. Continuous batching admits new requests at every step, while
running sequences decode one token each. When memory runs short the scheduler preempts the
newest sequence: it swaps its blocks to host memory or drops them and recomputes later.
A prefix cache hashes full blocks so that requests sharing a system prompt share its blocks.
GPUs read every weight once per decoded token, so decode speed is bounded by memory bandwidth.
PCIe links may train below their maximum width; NUMA nodes own memory and the CPUs near it.
Prometheus scrapes metrics, alert rules fire, and Alertmanager calls the agent, which retunes
the engine, verifies the effect and rolls back when it did not help. Hello, world! 0123456789
Once upon a time, a small model answered questions about clusters, schedulers and caches.
"""


def build_tokenizer(vocab_size: int, chat_template_family: str = "llama3"):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    # Appended after training, so the trained ids (and the default checkpoint) stay as they were.
    family = CHAT_FAMILIES[chat_template_family]
    new_special = [t for t in family.special_tokens if tok.token_to_id(t) is None]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in new_special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.added_tokens])
    return tok


@dataclass(slots=True)
class ModelSpec:
    preset: str = "tiny"
    arch: str = "llama"
    seed: int = 0
    dtype: str = "float32"
    tie_word_embeddings: bool = False
    shard_bytes: int = 0
    overrides: dict | None = None
    chat_template_family: str = "llama3"

    def __post_init__(self) -> None:
        if self.chat_template_family not in CHAT_FAMILIES:
            raise ValueError(
                f"chat_template_family must be one of {', '.join(CHAT_FAMILIES)}; got {self.chat_template_family!r}"
            )
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}; got {self.preset!r}")
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}; got {self.arch!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16; got {self.dtype!r}")


def hf_config(spec: ModelSpec, tokenizer_vocab: int, bos_id: int, eos_ids: list[int]) -> dict:
    shape = dict(PRESETS[spec.preset])
    shape.update(spec.overrides or {})
    # Small presets use exactly the tokenizer's vocabulary; the 8B shape keeps Llama-3's.
    if shape["vocab_size"] < 32000:
        shape["vocab_size"] = tokenizer_vocab
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[spec.arch]],
        "model_type": spec.arch,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "torch_dtype": spec.dtype,
        "bos_token_id": bos_id,
        "eos_token_id": eos_ids,
        "initializer_range": 0.02,
        "attention_bias": spec.arch == "qwen2",
        "use_cache": True,
    }
    if spec.arch == "mistral":
        config["sliding_window"] = None
    if spec.arch == "qwen2":
        config["use_sliding_window"] = False
    config.update(shape)
    config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    return config


def random_weights(config: dict, seed: int, dtype_name: str) -> dict:
    import torch

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(seed)
    h, inter, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv_heads, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]

    def normal(*shape, std):
        return (torch.randn(*shape, generator=gen) * std).to(dtype)

    # Tied: a unit-variance embedding would dominate the residual stream and the head
    # would echo the input token back; a small embedding leaves the layers in charge.
    embed_std = 0.1 if config["tie_word_embeddings"] else 1.0
    progress = Progress(
        config["num_hidden_layers"] + 2, "drawing random weights (embedding, layers, head)", unit="parts"
    )
    w = {"model.embed_tokens.weight": normal(v, h, std=embed_std)}
    progress.update()
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = normal(heads * hd, h, std=1 / math.sqrt(h))
        w[p + "self_attn.k_proj.weight"] = normal(kv_heads * hd, h, std=1 / math.sqrt(h))
        w[p + "self_attn.v_proj.weight"] = normal(kv_heads * hd, h, std=1 / math.sqrt(h))
        w[p + "self_attn.o_proj.weight"] = normal(h, heads * hd, std=1 / math.sqrt(heads * hd))
        if config.get("attention_bias"):
            for name, rows in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                w[p + f"self_attn.{name}_proj.bias"] = normal(rows, std=0.1)
        w[p + "mlp.gate_proj.weight"] = normal(inter, h, std=1 / math.sqrt(h))
        w[p + "mlp.up_proj.weight"] = normal(inter, h, std=1 / math.sqrt(h))
        w[p + "mlp.down_proj.weight"] = normal(h, inter, std=1 / math.sqrt(inter))
        w[p + "input_layernorm.weight"] = (1 + 0.1 * torch.randn(h, generator=gen)).to(dtype)
        w[p + "post_attention_layernorm.weight"] = (1 + 0.1 * torch.randn(h, generator=gen)).to(dtype)
        progress.update()
    w["model.norm.weight"] = (1 + 0.1 * torch.randn(h, generator=gen)).to(dtype)
    if config["tie_word_embeddings"]:
        # Tied: the head is the embedding, so scale the final norm to reach LOGIT_STD.
        w["model.norm.weight"] = (w["model.norm.weight"].float() * LOGIT_STD / (embed_std * math.sqrt(h))).to(dtype)
    else:
        w["lm_head.weight"] = normal(v, h, std=LOGIT_STD / math.sqrt(h))
    progress.update()
    progress.close()
    return w


def save_weights(weights: dict, out: Path, shard_bytes: int) -> None:
    from safetensors.torch import save_file

    meta = {"format": "pt"}
    if shard_bytes <= 0:
        with Progress(1, f"writing {out / 'model.safetensors'}", unit="files") as progress:
            save_file(weights, str(out / "model.safetensors"), metadata=meta)
            progress.update()
        return
    shards: list[dict] = [{}]
    size = 0
    for name, t in weights.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map = {}
    with Progress(len(shards), f"writing safetensors to {out}", unit="shards") as progress:
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out / fname), metadata=meta)
            weight_map.update({name: fname for name in shard})
            progress.update()
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def make_model(out_dir: str | Path, spec: ModelSpec) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    family = CHAT_FAMILIES[spec.chat_template_family]
    tok = build_tokenizer(
        PRESETS[spec.preset]["vocab_size"] if PRESETS[spec.preset]["vocab_size"] < 32000 else 4096,
        spec.chat_template_family,
    )
    bos_id = tok.token_to_id(family.bos_token or "<|begin_of_text|>")
    eos_ids = [tok.token_to_id(t) for t in family.eos_tokens]
    config = hf_config(spec, tok.get_vocab_size(), bos_id, eos_ids)
    save_weights(random_weights(config, spec.seed, spec.dtype), out, spec.shard_bytes)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": bos_id, "eos_token_id": eos_ids, "do_sample": False}, indent=2)
    )
    tok.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": family.bos_token,
        "eos_token": family.eos_token,
        "add_bos_token": family.bos_token is not None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "chat_template": family.template,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    return out


def add_arguments(parser) -> None:
    parser.add_argument("dir", help="output directory")
    parser.add_argument(
        "--preset",
        default="tiny",
        choices=sorted(PRESETS),
        help="model shape (llama3-8b-shape: 8B parameters, 16 GB in bfloat16)",
    )
    parser.add_argument("--arch", default="llama", choices=sorted(ARCHITECTURES), help="architecture in config.json")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weight dtype")
    parser.add_argument("--tie-word-embeddings", action="store_true", help="share the embedding with the LM head")
    parser.add_argument(
        "--chat-template-family",
        default="llama3",
        choices=list(CHAT_FAMILIES),
        help="chat template and special tokens: llama3 (default, no tools), or llama3.1, hermes (Qwen 2.5) and "
        "mistral, each with its tool-calling markup",
    )
    parser.add_argument(
        "--shard-bytes",
        type=int,
        default=0,
        help="split weights into shards of about this size in bytes; 0 writes one file",
    )


def run(args) -> int:
    spec = ModelSpec(
        preset=args.preset,
        arch=args.arch,
        seed=args.seed,
        dtype=args.dtype,
        tie_word_embeddings=args.tie_word_embeddings,
        shard_bytes=args.shard_bytes,
        chat_template_family=args.chat_template_family,
    )
    out = make_model(args.dir, spec)
    print(f"wrote {spec.preset} {spec.arch} checkpoint ({spec.chat_template_family} chat template) to {out}")
    return 0
