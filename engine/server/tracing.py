"""One OpenTelemetry span per request, with events queued, scheduled, first_token,
preempted and finished.

The span is driven from the engine thread (it sees scheduling and preemption), but
export is not: spans go to a `BatchSpanProcessor`, whose own thread sends them over
OTLP/HTTP; when the collector is slow or down its bounded queue drops spans instead
of blocking a step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from opentelemetry.propagate import extract
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

log = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
TRACE_HEADERS = ("traceparent", "tracestate")


def otlp_traces_url(endpoint: str) -> str:
    """`http://host:4318` -> `http://host:4318/v1/traces`; a URL with a path is kept."""
    if not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"--otlp-endpoint must be an http:// or https:// URL, got {endpoint!r}")
    rest = endpoint.split("://", 1)[1]
    return endpoint if "/" in rest.rstrip("/") else endpoint.rstrip("/") + TRACES_PATH


def make_tracer(
    endpoint: str, service_name: str = "inferd-engine", exporter=None, export_timeout_s: float = 5.0
) -> tuple[Tracer, Any]:
    """A tracer exporting to `endpoint` over OTLP/HTTP in the background; returns
    (tracer, provider) so the caller can shut the provider down (flushing spans)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=otlp_traces_url(endpoint), timeout=export_timeout_s)
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=4096, schedule_delay_millis=1000))
    return provider.get_tracer("inferd.engine.server"), provider


@dataclass(slots=True)
class _Tracked:
    span: Span
    scheduled: bool = False
    first_token: bool = False
    preemptions: int = 0


class RequestTracer:
    """Engine-thread side: call `queued` when a request is added, `after_step` after each
    step, `finished` when it ends. Not thread-safe by design (one engine thread)."""

    def __init__(self, tracer: Tracer):
        self._tracer = tracer
        self._tracked: dict[str, _Tracked] = {}

    def queued(
        self,
        request_id: str,
        num_prompt_tokens: int,
        params,
        priority: int,
        arrival_ns: int,
        trace_headers: dict[str, str] | None = None,
    ) -> None:
        # A caller's W3C `traceparent` makes the request span its child.
        parent = extract(trace_headers) if trace_headers else None
        span = self._tracer.start_span(
            "llm_request",
            context=parent,
            kind=SpanKind.SERVER,
            start_time=arrival_ns,
            attributes={
                "gen_ai.request.id": request_id,
                "gen_ai.usage.prompt_tokens": num_prompt_tokens,
                "gen_ai.request.max_tokens": params.max_tokens,
                "gen_ai.request.n": params.n,
                "gen_ai.request.temperature": float(params.temperature),
                "gen_ai.request.top_p": float(params.top_p),
                "inferd.priority": priority,
            },
        )
        span.add_event("queued", timestamp=arrival_ns)
        self._tracked[request_id] = _Tracked(span)

    def after_step(self, requests: dict) -> None:
        """`requests`: the engine's live requests (read in the engine thread)."""
        for rid, t in self._tracked.items():
            req = requests.get(rid)
            if req is None:
                continue
            seqs = req.seqs
            if not t.scheduled and any(s.times.first_scheduled is not None for s in seqs):
                t.scheduled = True
                t.span.add_event(
                    "scheduled",
                    timestamp=_ns(min(s.times.first_scheduled for s in seqs if s.times.first_scheduled is not None)),
                )
            if not t.first_token and any(s.times.first_token is not None for s in seqs):
                t.first_token = True
                t.span.add_event(
                    "first_token",
                    timestamp=_ns(min(s.times.first_token for s in seqs if s.times.first_token is not None)),
                )
            preemptions = sum(s.num_preemptions for s in seqs)
            if preemptions > t.preemptions:
                t.span.add_event("preempted", attributes={"inferd.preemptions": preemptions})
                t.preemptions = preemptions

    def finished(
        self, request_id: str, finish_reason: str, num_generation_tokens: int, error: str | None = None
    ) -> None:
        t = self._tracked.pop(request_id, None)
        if t is None:
            return
        # A request that finished within the step of its first token left the engine before
        # after_step could see it; its events are stamped now.
        if num_generation_tokens and not t.scheduled:
            t.span.add_event("scheduled")
        if num_generation_tokens and not t.first_token:
            t.span.add_event("first_token")
        t.span.set_attribute("gen_ai.response.finish_reason", finish_reason)
        t.span.set_attribute("gen_ai.usage.completion_tokens", num_generation_tokens)
        t.span.set_attribute("inferd.preemptions", t.preemptions)
        t.span.add_event("finished", attributes={"finish_reason": finish_reason})
        if error:
            t.span.set_status(Status(StatusCode.ERROR, error))
        t.span.end()

    @property
    def num_open(self) -> int:
        return len(self._tracked)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
