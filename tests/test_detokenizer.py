"""Incremental detokenisation equals decoding the whole output, after every token."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferd.engine.text.detokenizer import IncrementalDetokenizer
from inferd.engine.text.tokenizer import Tokenizer

TEXTS = ["Hello, world!", "héllo wörld — ça va? 日本語のテキスト 🙂🚀", "a\u00a0b\u200dc\r\n\t  x", "€" * 7 + "𝄞"]
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tok(tiny_model) -> Tokenizer:
    return Tokenizer(tiny_model)


def llama2_style_tokenizer(directory) -> Tokenizer:
    """A sentencepiece-like tokenizer (Metaspace, byte fallback, a decoder that strips
    the first token's leading space), trained here: the text of a window of tokens
    depends on where the window starts."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = HFTokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens)
    hf.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20 + TEXTS, trainer)
    hf.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    return Tokenizer(directory)


def assert_matches_full_decode(tok: Tokenizer, ids: list[int], skip_special_tokens: bool) -> None:
    detok = IncrementalDetokenizer(skip_special_tokens)
    for n in range(1, len(ids) + 1):
        prefix = ids[:n]
        assert detok.update(tok, prefix) == tok.decode(prefix, skip_special_tokens=skip_special_tokens), prefix
        assert detok.text == tok.decode(prefix, skip_special_tokens=skip_special_tokens)


@SETTINGS
@given(data=st.data(), skip=st.booleans())
def test_random_tokens_match_full_decode(tok, data, skip):
    # Any id of the vocabulary, specials (the first few ids) over-represented.
    ids = data.draw(st.lists(st.one_of(st.integers(0, tok.vocab_size - 1), st.integers(0, 6)), max_size=60))
    assert_matches_full_decode(tok, ids, skip)


@SETTINGS
@given(data=st.data(), skip=st.booleans())
def test_multibyte_text_matches_full_decode(tok, data, skip):
    # Real text split into byte-level tokens, with special tokens dropped in anywhere.
    text = data.draw(st.sampled_from(TEXTS) | st.text(min_size=1, max_size=30))
    ids = tok.encode(text, add_special_tokens=False)
    for _ in range(data.draw(st.integers(0, 3))):
        ids.insert(data.draw(st.integers(0, len(ids))), data.draw(st.sampled_from(tok.eos_token_ids + [0, 2])))
    assert_matches_full_decode(tok, ids, skip)


def test_split_characters_show_the_replacement_character_until_complete(tok):
    ids = tok.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1  # four bytes over several tokens
    detok = IncrementalDetokenizer()
    texts = [detok.update(tok, ids[:n]) for n in range(1, len(ids) + 1)]
    assert texts[-1] == "🙂"
    assert all(t.endswith("\ufffd") for t in texts[:-1])


def test_ids_past_the_vocabulary_decode_to_nothing(tok):
    ids = tok.encode("Hello", add_special_tokens=False)
    detok = IncrementalDetokenizer()
    assert detok.update(tok, ids + [tok.vocab_size + 3]) == "Hello"


@settings(max_examples=200, deadline=None)
@given(data=st.data(), skip=st.booleans())
def test_sentencepiece_style_decoder_matches_full_decode(tmp_path_factory, data, skip):
    tok = _sp_tokenizer(tmp_path_factory)
    text = data.draw(st.sampled_from(TEXTS + ["the quick brown fox", "  fox  dog "]) | st.text(max_size=20))
    ids = tok.encode(text, add_special_tokens=False)
    ids += data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=10))
    assert_matches_full_decode(tok, ids, skip)


def test_a_valid_byte_later_grouped_with_an_invalid_one_is_not_committed(tmp_path_factory):
    """Found by the test above: a space byte then a lone continuation byte decode, as a
    byte-fallback group, to two replacement characters; the space shown one step
    earlier must not stay in the text."""
    tok = _sp_tokenizer(tmp_path_factory)
    ids = tok.encode("Hello, world!", add_special_tokens=False) + [
        tok._tok.token_to_id("<0x20>"),
        tok._tok.token_to_id("<0x80>"),
    ]
    assert tok.decode(ids, skip_special_tokens=False).endswith("!\ufffd\ufffd")  # the byte tokens are specials here
    assert_matches_full_decode(tok, ids, skip_special_tokens=False)
    assert len(tok.byte_fallback_ids) == 256


_SP: dict[str, Tokenizer] = {}


def _sp_tokenizer(tmp_path_factory) -> Tokenizer:
    if "tok" not in _SP:
        _SP["tok"] = llama2_style_tokenizer(tmp_path_factory.mktemp("sp"))
    return _SP["tok"]


class _WindowRecorder:
    """A tokenizer that records how many ids each decode call was given."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.sizes: list[int] = []
        self.decode_is_concatenative = tok.decode_is_concatenative
        self.byte_fallback_ids = tok.byte_fallback_ids

    def decode(self, ids, skip_special_tokens=True):
        self.sizes.append(len(ids))
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("text", TEXTS[:2] + ["The engine keeps the key and value cache in fixed-size blocks. " * 20])
def test_each_step_decodes_a_short_window(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    recorder = _WindowRecorder(tok)
    detok = IncrementalDetokenizer()
    for n in range(1, len(ids) + 1):
        detok.update(recorder, ids[:n])
    assert detok.text == text
    assert max(recorder.sizes) <= 8  # a character spans at most 4 byte-level tokens
    assert sum(recorder.sizes) <= 6 * len(ids)
    assert len(recorder.sizes) == len(ids)  # byte-level: one decode per token


def test_only_byte_level_decoders_count_as_concatenative(tok, tmp_path_factory):
    assert tok.decode_is_concatenative
    assert not _sp_tokenizer(tmp_path_factory).decode_is_concatenative


@pytest.mark.parametrize("skip", [True, False])
def test_engine_text_equals_full_decode_at_every_step(tiny_model, skip):
    from inferd.engine.config import EngineConfig
    from inferd.engine.llm_engine import LLMEngine
    from inferd.engine.request.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=tiny_model, device="cpu", seed=3))
    params = SamplingParams(max_tokens=40, temperature=1.5, ignore_eos=True, skip_special_tokens=skip)
    for i in range(6):
        engine.add_request(f"r{i}", [5 + i, 40, 300, 7], params)
    num_checked = 0
    while engine.has_unfinished():
        for out in engine.step():
            o = out.outputs[0]
            assert o.text == engine.tokenizer.decode(o.token_ids, skip_special_tokens=skip)
            num_checked += 1
    assert num_checked == 6 * 40
