"""Tokenizer from a checkpoint's tokenizer.json and tokenizer_config.json."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _token_content(value) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...} as older configs write it
        return value.get("content")
    return value


class Tokenizer:
    def __init__(self, model_dir: str | Path, eos_token_ids: list[int] | None = None):
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: a checkpoint needs tokenizer.json")
        self._tok = _HFTokenizer.from_file(str(path))
        config_path = model_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.chat_template: str | None = config.get("chat_template")
        self.bos_token: str | None = _token_content(config.get("bos_token"))
        self.eos_token: str | None = _token_content(config.get("eos_token"))
        self.add_bos_token: bool = bool(config.get("add_bos_token", False))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        ids = list(eos_token_ids or [])
        if self.eos_token and (eid := self._tok.token_to_id(self.eos_token)) is not None and eid not in ids:
            ids.append(eid)
        self.eos_token_ids: list[int] = ids
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        # Byte-level BPE (GPT-2, Llama 3, Qwen): the text of a + b is the text of a then
        # that of b whenever a's ends in a whole character (the incremental detokenizer
        # then needs one decode per step, not two).
        self.decode_is_concatenative = isinstance(self._tok.decoder, decoders.ByteLevel)
        # Sentencepiece byte fallback (<0x20>, <0xE2>, ...): consecutive byte tokens decode as
        # one group, and a later invalid byte turns the whole group, earlier valid bytes
        # included, into replacement characters. Text ending in one is not final yet.
        self.byte_fallback_ids: frozenset[int] = (
            frozenset()
            if self.decode_is_concatenative
            else frozenset(
                i for token, i in self._tok.get_vocab(with_added_tokens=False).items() if _BYTE_TOKEN.fullmatch(token)
            )
        )

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        # Ids past the tokenizer's vocabulary (a model may pad its embedding) decode to nothing.
        if ids and max(ids) >= self.vocab_size:
            ids = [i for i in ids if i < self.vocab_size]
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)
