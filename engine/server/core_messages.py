"""The messages between the API server process and the engine core process.

Two ZeroMQ PUSH/PULL channels carry msgpack-encoded (msgspec) messages, one each way:

    API -> core: AddRequest, AbortRequests, UtilityCall, Shutdown
    core -> API: CoreReady | CoreFailed (once, at start-up), StepOutputs (one per step),
                 Heartbeat (idle), UtilityResult (one per UtilityCall)

The core sends deltas, not cumulative outputs: per sequence the new token ids and
logprobs, and how its text changed (`text_keep` characters of what was sent stay, then
`text_add`; the detokenizer may rewrite a trailing partial character and a stop string
cuts the tail, so text is not append-only). The API side rebuilds cumulative
`RequestOutput`s from them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec

from ..request.prompt_logprobs import PromptLogprobs
from ..request.request_validator import RequestLimits
from ..request.sampling_params import SamplingParams
from ..request.slo import RequestSlo
from ..stats import StepStats
from .snapshot import EngineSnapshot

# --- API -> core ----------------------------------------------------------------------


class AddRequest(msgspec.Struct, tag="add", array_like=True):
    request_id: str
    prompt: str | None  # the prompt text, for the output's `prompt` field
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    arrival_time: float
    trace_headers: dict[str, str] | None = None
    final_only: bool = False  # send this request's outputs once, when it finishes (non-streaming)
    slo: RequestSlo | None = None  # None: best effort, ordered as without SLO classes


class AbortRequests(msgspec.Struct, tag="abort", array_like=True):
    request_ids: list[str]


class UtilityCall(msgspec.Struct, tag="call", array_like=True):
    """A command run between steps: get_tunables, reconfigure, set_mode or
    inject_fastpath_failure (engine_core.EngineCore._call)."""

    call_id: int
    method: str
    args: list[Any]


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


ToCore = AddRequest | AbortRequests | UtilityCall | Shutdown

# --- core -> API ----------------------------------------------------------------------


class SeqDelta(msgspec.Struct, array_like=True):
    index: int
    new_token_ids: list[int]
    new_logprobs: list[dict[int, float]] | None
    text_keep: int
    text_add: str
    finish_reason: str | None
    stop_reason: str | int | None


class RequestDelta(msgspec.Struct, array_like=True):
    request_id: str
    seqs: list[SeqDelta]
    finished: bool
    num_cached_tokens: int = 0
    # Sent once, with the request's first delta (the prompt is scored by then), when its
    # params ask for prompt logprobs.
    prompt_logprobs: PromptLogprobs | None = None


class RequestError(msgspec.Struct, array_like=True):
    """The engine dropped this request: a step failed under it, or it was refused at add."""

    request_id: str
    message: str
    is_client_error: bool  # the add was refused for a reason the client can fix (a 4xx)
    unavailable_reason: str | None = None  # refused for now (a 503 with Retry-After), e.g. grammar_compiler_busy


class StepOutputs(msgspec.Struct, tag="outputs", array_like=True):
    outputs: list[RequestDelta]
    errors: list[RequestError]
    stats: StepStats | None
    snapshot: EngineSnapshot | None  # at most every snapshot_interval_s, and whenever the engine turns idle


class Heartbeat(msgspec.Struct, tag="heartbeat", array_like=True):
    snapshot: EngineSnapshot | None


class UtilityResult(msgspec.Struct, tag="result", array_like=True):
    call_id: int
    result: Any = None
    error_type: str | None = None  # "ValueError" for a refused change, else the exception's type
    error_message: str | None = None
    error_field: str | None = None  # the tunable a refused change concerns


class CoreReady(msgspec.Struct, tag="ready", array_like=True):
    pid: int
    limits: RequestLimits
    tunables: dict[str, Any]
    snapshot: EngineSnapshot
    fast_path_unavailable: str | None = None  # why the portable path runs whatever the mode


class CoreFailed(msgspec.Struct, tag="failed", array_like=True):
    """The core could not start (bad checkpoint, no memory) or its loop died."""

    message: str


FromCore = StepOutputs | Heartbeat | UtilityResult | CoreReady | CoreFailed


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is Counter:  # EngineCounters' per-reason counts
        return Counter(obj)
    raise NotImplementedError(f"cannot decode {kind}")


def encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def to_core_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(ToCore, dec_hook=_dec_hook)


def from_core_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(FromCore, dec_hook=_dec_hook)
