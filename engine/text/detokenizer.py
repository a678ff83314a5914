"""Incremental detokenisation: a sequence's text grows by decoding a few new tokens
per step instead of its whole output (which made a request O(n^2) in its length).

vLLM's prefix/read offsets: `text` always equals `tokenizer.decode(ids)` of all the
ids seen so far. It is kept as
    stable  = decode(ids[:read])                          (fixed once committed)
    + decode(ids[prefix:])[len(decode(ids[prefix:read])):]   (the unstable tail)
Decoding the window from `prefix` rather than from `read` gives the tail its left
context: a multi-byte character split over tokens, or a decoder that strips the
first token's leading space (sentencepiece's Metaspace), come out as in the full
decode. The offsets advance only when the window's text ends in a whole character
(no trailing U+FFFD) and not in a sentencepiece byte-fallback token (a later byte may
turn the whole byte group into replacement characters), so the next window starts at a
clean boundary; until then the tail, replacement character included, is shown as the full
decode shows it.
"""

from __future__ import annotations

from .tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    __slots__ = ("skip_special_tokens", "text", "_stable", "_prefix_offset", "_read_offset", "_prefix_text")

    def __init__(self, skip_special_tokens: bool = True):
        self.skip_special_tokens = skip_special_tokens
        self.text = ""  # decode(all ids so far)
        self._stable = ""  # decode(ids[:_read_offset])
        self._prefix_offset = 0  # the window decoded each step starts here
        self._read_offset = 0  # ids before this are in _stable
        self._prefix_text = ""  # decode(ids[_prefix_offset:_read_offset])

    def update(self, tokenizer: Tokenizer, ids: list[int]) -> str:
        """The text of `ids`, the ids of the previous call plus any appended since."""
        skip = self.skip_special_tokens
        window = tokenizer.decode(ids[self._prefix_offset :], skip_special_tokens=skip)
        if not window.startswith(self._prefix_text):
            # A decoder whose text is not local to its tokens: decode everything and
            # start the window over from the first token.
            self.text = tokenizer.decode(ids, skip_special_tokens=skip)
            self._stable, self._prefix_text = "", ""
            self._prefix_offset = self._read_offset = 0
            return self.text
        tail = window[len(self._prefix_text) :]
        self.text = self._stable + tail
        if tail and not window.endswith(REPLACEMENT_CHAR) and ids[-1] not in tokenizer.byte_fallback_ids:
            self._stable = self.text
            self._prefix_offset, self._read_offset = self._read_offset, len(ids)
            self._prefix_text = (
                tail
                if tokenizer.decode_is_concatenative
                else tokenizer.decode(ids[self._prefix_offset : self._read_offset], skip_special_tokens=skip)
            )
        return self.text
