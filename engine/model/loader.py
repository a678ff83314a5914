"""Load a Llama-family model from a local Hugging Face checkpoint directory."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from .dummy_weights import confine_head_to_tokenizer, random_model_on_device
from .model import LlamaModel, rope_inv_freq
from .model_config import ModelConfig
from .progress import Progress

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({model_dir / name for name in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"shards named in {index} are missing: {', '.join(missing)}")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if not found:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    return found


def resolve_dtype(name: str, cfg: ModelConfig, device: torch.device) -> torch.dtype:
    if name == "auto":
        # CPUs have slow bf16/fp16 matmuls; run them in float32.
        name = cfg.torch_dtype if device.type == "cuda" else "float32"
        name = name if name in TORCH_DTYPES else "float32"
    return TORCH_DTYPES[name]


def load_model(
    model_dir: str | Path, dtype: torch.dtype, device: torch.device, load_format: str = "auto", seed: int = 0
) -> LlamaModel:
    """The checkpoint's weights (`auto`), or random ones drawn on the device (`dummy`)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} does not exist")
    if load_format == "dummy":
        return confine_head_to_tokenizer(random_model_on_device(model_dir, dtype, device, seed=seed), model_dir)
    cfg = ModelConfig.from_dir(model_dir)
    with torch.device("meta"):
        model = LlamaModel(cfg)
    params = dict(model.named_parameters())
    expected = {("model." + n if not n.startswith("lm_head") else n) for n in params}
    if cfg.tie_word_embeddings:
        expected.discard("lm_head.weight")
    loaded: dict[str, torch.Tensor] = {}
    with Progress(len(expected), f"loading weights from {model_dir}", unit="tensors") as progress:
        for path in safetensors_files(model_dir):
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():
                    if name in expected:
                        loaded[name] = f.get_tensor(name).to(dtype=dtype)
                        progress.update()
    missing = sorted(expected - set(loaded))
    if missing:
        raise ValueError(
            f"checkpoint {model_dir} lacks weights: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}"
        )
    state = {(n[len("model.") :] if n.startswith("model.") else n): t for n, t in loaded.items()}
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    # Buffers are not in the checkpoint; build them off the meta device.
    model.rotary.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
    return model.to(device).eval()
