"""Hugging Face transformers as the correctness oracle."""

from __future__ import annotations

import torch


def load_hf(model_dir: str):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


@torch.inference_mode()
def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation, one prompt at a time (no padding: the exact reference)."""
    ids = torch.tensor([prompt_ids])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        min_new_tokens=max_new_tokens,
    )
    return out[0, len(prompt_ids) :].tolist()


@torch.inference_mode()
def hf_logits(model, token_ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([token_ids])).logits[0].float()
