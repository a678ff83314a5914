"""Structured outputs through xgrammar: a constraint becomes a grammar, the grammar is
compiled against the model's vocabulary, and each constrained sequence gets a matcher
that says, per step, which tokens may come next (a bitmask the sampler applies to the
logits on their device) and advances with the token drawn.

Compiling (tens of milliseconds to seconds for a large schema over a 128k vocabulary)
runs in worker processes (compiler.py: bounded in time and queue, and
killed when the grammar's requests have all gone), never in the step: a request whose
grammar is not compiled yet waits outside the scheduler (`hold` / `take_ready`) while the
others keep stepping. Compiled grammars are cached by their constraint, so repeated
schemas compile once; the cache is bounded in entries and in bytes.
A grammar that terminates allows only the stop tokens, so the sequence ends through the
ordinary EOS check (output_processor.py).
"""

from __future__ import annotations

import json
import logging
import re
import weakref
from collections import OrderedDict
from concurrent.futures import CancelledError, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .compiler import GrammarCompiler
from .params import StructuredOutputsParams

if TYPE_CHECKING:
    import xgrammar as xgr

    from ..request.sequence import Sequence
    from ..text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

MAX_CACHED_GRAMMARS = 256
DEFAULT_GRAMMAR_CACHE_BYTES = 256 << 20

# xgrammar's errors start "[20:16:44] /project/cpp/regex_converter.cc:94: "; the reason follows.
_XGR_PREFIX = re.compile(r"^(\[[^\]]*\]\s*)?\S+\.(cc|h):\d+:\s*")


def _literal(text: str) -> str:
    """An EBNF string literal: xgrammar reads JSON's escapes."""
    return json.dumps(text, ensure_ascii=False)


# xgrammar writes a length-bounded string's characters (maxLength, pydantic's max_length)
# as any character but quote, backslash, CR and LF: raw control characters, which JSON
# forbids inside strings and json.loads refuses, get through. Its unbounded strings
# exclude them; the bounded ones are rewritten to the same class.
_BOUNDED_STRING_CHAR = r"[^\"\\\r\n]"
_JSON_STRING_CHAR = r"[^\"\\\0-\x1f]"


def _json_strings_without_controls(grammar: xgr.Grammar) -> xgr.Grammar:
    import xgrammar as xgr

    text = str(grammar)
    if _BOUNDED_STRING_CHAR not in text:
        return grammar
    return xgr.Grammar.from_ebnf(text.replace(_BOUNDED_STRING_CHAR, _JSON_STRING_CHAR))


def build_grammar(params: StructuredOutputsParams) -> xgr.Grammar:
    """The constraint as an xgrammar Grammar (no tokenizer needed, so the API server
    checks it too); a ValueError naming the constraint's field when it is invalid."""
    import xgrammar as xgr

    kind = params.kind
    try:
        if kind == "json":
            # Compact separators, no free whitespace: a model cannot pad the output forever.
            schema = params.schema_text or ""
            grammar = _json_strings_without_controls(
                xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True)
            )
            if params.before or params.after:
                parts = [xgr.Grammar.from_ebnf(f"root ::= {_literal(t)}") for t in (params.before, params.after) if t]
                grammar = xgr.Grammar.concat(
                    *([parts[0]] if params.before else []), grammar, *([parts[-1]] if params.after else [])
                )
            return grammar
        if kind == "json_object":
            return _json_strings_without_controls(
                xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
            )
        if kind == "regex":
            return xgr.Grammar.from_regex(params.regex or "")
        if kind == "choice":
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(_literal(c) for c in params.choice or []))
        text = params.grammar or ""
        if "::=" in text:
            return xgr.Grammar.from_ebnf(text)
        return xgr.Grammar.from_lark(text)  # vLLM's guided_grammar takes Lark (`rule: ...`) too
    except (RuntimeError, ValueError, TypeError) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = _XGR_PREFIX.sub("", lines[0]) if lines else type(exc).__name__
        raise ValueError(f"structured_outputs.{kind} is invalid: {reason}") from None


def tokenizer_info(tokenizer: Tokenizer, vocab_size: int) -> xgr.TokenizerInfo:
    """The vocabulary as xgrammar reads it: token text by id (ids past the tokenizer,
    padding of the embedding, are never allowed) and how token text maps to bytes."""
    import xgrammar as xgr

    vocab = tokenizer._tok.get_vocab(with_added_tokens=True)
    encoded = [""] * max(vocab_size, max(vocab.values(), default=-1) + 1)
    for token, i in vocab.items():
        encoded[i] = token
    if tokenizer.decode_is_concatenative:
        vocab_type = xgr.VocabType.BYTE_LEVEL
    elif tokenizer.byte_fallback_ids:
        vocab_type = xgr.VocabType.BYTE_FALLBACK
    else:
        vocab_type = xgr.VocabType.RAW
    first = tokenizer._tok.encode("a", add_special_tokens=False).tokens
    add_prefix_space = bool(first) and first[0].startswith("\u2581")  # sentencepiece's "▁a"
    return xgr.TokenizerInfo(
        encoded[:vocab_size],
        vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=list(tokenizer.eos_token_ids),
        add_prefix_space=add_prefix_space,
    )


@dataclass(slots=True)
class TokenMask:
    """Per-step allowed tokens: `bitmask` [num sampling rows, ceil(vocab / 32)] int32
    (bit set = allowed, xgrammar's layout), meaningful on `rows` only."""

    bitmask: torch.Tensor
    rows: list[int]


@dataclass(slots=True)
class _Held:
    seqs: list[Sequence]
    grammar: Future[Any]


class StructuredOutputs:
    """The engine's grammars and matchers. Engine thread: hold, take_ready, fill, accept,
    release. The compiler's threads and processes: building the tokenizer info and compiling."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        device: torch.device,
        *,
        num_workers: int = 2,
        compile_timeout_s: float = 10.0,
        max_queued: int = 16,
        cache_bytes: int = DEFAULT_GRAMMAR_CACHE_BYTES,
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.device = device
        self.cache_bytes = cache_bytes
        self.compiler = GrammarCompiler(
            build_grammar,
            lambda: tokenizer_info(tokenizer, vocab_size),
            num_workers=num_workers,
            timeout_s=compile_timeout_s,
            max_queued=max_queued,
            max_grammar_bytes=cache_bytes,
        )
        # Its worker processes hold a few hundred MB each: an engine dropped without close()
        # (offline use) must not leave them behind.
        weakref.finalize(self, self.compiler.close)
        # Least recently used first; a client sending a new schema per request cannot grow it past the bounds.
        self._cache: OrderedDict[tuple[str, str, str, str], Future[Any]] = OrderedDict()
        self._sizes: dict[Future[Any], int] = {}  # compiled grammars' bytes, by the cache's futures
        self._held: dict[str, _Held] = {}
        self._matchers: dict[Sequence, Any] = {}
        self.num_compiled = 0

    # --- compiling -----------------------------------------------------------------
    def compile(self, params: StructuredOutputsParams) -> Future[Any]:
        """The grammar's future, cached; GrammarCompilerBusy when too many wait to compile."""
        key = params.cache_key
        future = self._cache.get(key)
        if future is None or (future.done() and (future.cancelled() or future.exception() is not None)):
            future = self.compiler.submit(params)
            future.add_done_callback(self._count_compiled)
            self._cache[key] = future
        self._cache.move_to_end(key)
        self._evict()
        return future

    def _count_compiled(self, future: Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.num_compiled += 1

    @property
    def num_cached_bytes(self) -> int:
        return sum(self._size(f) for f in self._cache.values())

    def _size(self, future: Future[Any]) -> int:
        if not future.done() or future.cancelled() or future.exception() is not None:
            return 0
        size = self._sizes.get(future)
        if size is None:
            size = self._sizes[future] = int(future.result().memory_size_bytes)
        return size

    def _evict(self) -> None:
        """Least recently used first, until both bounds hold (requests holding an evicted
        grammar keep it; a grammar larger than the whole budget is never kept)."""
        total = self.num_cached_bytes
        while self._cache and (len(self._cache) > MAX_CACHED_GRAMMARS or total > self.cache_bytes):
            _, future = self._cache.popitem(last=False)
            total -= self._size(future)
            self._sizes.pop(future, None)

    def hold(self, request_id: str, seqs: list[Sequence], params: StructuredOutputsParams) -> None:
        """Keep a request's sequences until its grammar is compiled (take_ready)."""
        self._held[request_id] = _Held(seqs, self.compile(params))

    def take_ready(self) -> tuple[list[Sequence], dict[str, str]]:
        """Sequences whose grammar is ready, each with its matcher now, and the requests
        whose grammar failed to compile (request id -> reason)."""
        import xgrammar as xgr

        ready: list[Sequence] = []
        failed: dict[str, str] = {}
        for request_id, held in list(self._held.items()):
            if not held.grammar.done():
                continue
            del self._held[request_id]
            exc = (
                CancelledError("the grammar compile was cancelled")
                if held.grammar.cancelled()
                else held.grammar.exception()
            )
            if exc is not None:
                failed[request_id] = str(exc)
                continue
            for seq in held.seqs:
                self._matchers[seq] = xgr.GrammarMatcher(held.grammar.result())
            ready += held.seqs
        if ready or failed:
            self._evict()
        return ready, failed

    @property
    def num_held(self) -> int:
        return len(self._held)

    def wait(self, timeout: float) -> None:
        """Block until some held grammar is ready or `timeout` passes (an idle engine)."""
        if self._held:
            wait_futures([h.grammar for h in self._held.values()], timeout, return_when="FIRST_COMPLETED")

    def drop(self, request_id: str) -> None:
        """An aborted request: forget it whether held or running. A grammar still compiling
        that no other request waits for is abandoned (its worker is stopped)."""
        held = self._held.pop(request_id, None)
        if held is None:
            for seq in [s for s in self._matchers if s.request_id == request_id]:
                del self._matchers[seq]
            return
        future = held.grammar
        if not future.done() and all(h.grammar is not future for h in self._held.values()):
            for key in [k for k, f in self._cache.items() if f is future]:
                del self._cache[key]
            self.compiler.abandon(future)

    # --- per step --------------------------------------------------------------------
    def fill(self, seqs: list[Sequence]) -> TokenMask | None:
        """The allowed-token bitmask of the step's sampling rows, on the logits' device,
        or None when none of them is constrained (then xgrammar is not needed)."""
        rows = [i for i, seq in enumerate(seqs) if seq in self._matchers]
        if not rows:
            return None
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(len(seqs), self.vocab_size)
        for i in rows:
            self._matchers[seqs[i]].fill_next_token_bitmask(bitmask, i)
        if self.device.type != "cpu":
            bitmask = bitmask.pin_memory().to(self.device, non_blocking=True)
        return TokenMask(bitmask, rows)

    def accept(self, seqs: list[Sequence], tokens: list[int]) -> None:
        """Advance each constrained sequence's matcher with the token it drew."""
        for seq, token in zip(seqs, tokens):
            matcher = self._matchers.get(seq)
            if matcher is not None and not matcher.is_terminated() and not matcher.accept_token(token):
                # Only a row whose every allowed token was banned (min_tokens against a
                # grammar that can only stop) gets here; its output no longer matches.
                log.warning("request %s drew token %d outside its grammar", seq.request_id, token)

    def release_finished(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            if seq.is_finished:
                self._matchers.pop(seq, None)

    def close(self) -> None:
        self.compiler.close()
