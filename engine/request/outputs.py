"""What the engine returns: shaped like vLLM's RequestOutput / CompletionOutput."""

from __future__ import annotations

from dataclasses import dataclass, field

from .prompt_logprobs import PromptLogprobs


class CompletionOutput:
    """One completion as of the step that returned it.

    `token_ids` and `logprobs` are snapshots, taken lazily: the engine may hand over a
    sequence's live, append-only list with the number of entries that belong to this
    output (`num_tokens`); the first read copies that prefix, which later appends never
    touch. Outputs nobody reads cost no copy (the server keeps only the newest when a
    client falls behind; the offline API reads only the final one, whose lists no
    longer grow and are handed over whole)."""

    __slots__ = ("index", "text", "_token_ids", "_logprobs", "_num_tokens", "finish_reason", "stop_reason")

    def __init__(
        self,
        index: int,
        text: str,
        token_ids: list[int],
        logprobs: list[dict[int, float]] | None = None,
        finish_reason: str | None = None,
        stop_reason: str | int | None = None,
        num_tokens: int | None = None,
    ):
        self.index = index
        self.text = text
        self._token_ids = token_ids
        self._logprobs = logprobs
        self._num_tokens = num_tokens  # None: the lists are this output's own
        self.finish_reason = finish_reason  # "stop", "length", "abort"
        self.stop_reason = stop_reason

    def _snapshot(self) -> None:
        n = self._num_tokens
        if n is not None:
            self._token_ids = self._token_ids[:n]
            self._logprobs = self._logprobs[:n] if self._logprobs is not None else None
            self._num_tokens = None

    @property
    def token_ids(self) -> list[int]:
        self._snapshot()
        return self._token_ids

    @token_ids.setter
    def token_ids(self, value: list[int]) -> None:
        self._snapshot()
        self._token_ids = value

    @property
    def logprobs(self) -> list[dict[int, float]] | None:
        self._snapshot()
        return self._logprobs

    @logprobs.setter
    def logprobs(self, value: list[dict[int, float]] | None) -> None:
        self._snapshot()
        self._logprobs = value

    def token_ids_since(self, start: int) -> list[int]:
        """token_ids[start:], without copying the prefix."""
        end = self._num_tokens if self._num_tokens is not None else len(self._token_ids)
        return self._token_ids[start:end]

    def logprobs_since(self, start: int) -> list[dict[int, float]] | None:
        if self._logprobs is None:
            return None
        end = self._num_tokens if self._num_tokens is not None else len(self._logprobs)
        return self._logprobs[start:end]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def _fields(self) -> tuple:
        return (self.index, self.text, self.token_ids, self.logprobs, self.finish_reason, self.stop_reason)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CompletionOutput):
            return NotImplemented
        return self._fields() == other._fields()

    # mutable, like the dataclass it replaces; typeshed types object.__hash__ as a method, not None
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"CompletionOutput(index={self.index!r}, text={self.text!r}, token_ids={self.token_ids!r}, "
            f"logprobs={self.logprobs!r}, finish_reason={self.finish_reason!r}, stop_reason={self.stop_reason!r})"
        )


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0
    # With SamplingParams.prompt_logprobs: None for the first prompt token, then
    # {token id: Logprob} per prompt token (engine/request/prompt_logprobs.py), as vLLM's.
    prompt_logprobs: PromptLogprobs | None = None
