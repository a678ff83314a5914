"""ASGI middleware: the request-body limit (413), http_requests_total, and X-Request-Id.

Pure ASGI rather than Starlette's BaseHTTPMiddleware, which would stand between a
streaming response and the client's disconnect.

A 413 goes out with `Connection: close`, and then the rest of the body is read and
thrown away (up to `DISCARD_LIMIT_BYTES` and `DISCARD_TIMEOUT_S`) before the response
ends and the server closes the socket: closing with unread bytes in the receive
buffer makes the kernel send a reset, and a client still writing its body (most
clients write it all before reading) then loses the 413 it was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_body
from .metrics import HttpMetrics

KNOWN_HANDLERS = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/health",
        "/ready",
        "/metrics",
        "/admin/config",
        "/admin/mode",
        "/admin/fault",
    }
)
# Labels come from the request line, which the client writes: anything else is counted as
# "other", so made-up paths or methods cannot add series without bound.
KNOWN_METHODS = frozenset({"GET", "POST", "PATCH", "PUT", "DELETE", "HEAD", "OPTIONS"})
DISCARD_LIMIT_BYTES = 64 << 20
DISCARD_TIMEOUT_S = 10.0
REQUEST_ID_HEADER = b"x-request-id"
# A client's X-Request-Id is echoed when it is 1-128 visible ASCII characters (a UUID, a
# trace id, "Root=1-...;Parent=..."); anything else is not written back into a header or
# a log line, and the response carries the server's id instead.
CLIENT_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")
REQUEST_ID_STATE_KEY = "request_id"


class RequestIdHeader:
    """Sets `X-Request-Id` on every response, as vLLM's XRequestIdMiddleware does:
    `response_request_id`. Outermost, so a 413 from the body limit carries it too
    (a 500 from an unexpected exception is sent outside every middleware: its handler
    sets the header itself)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers") or [] if k.lower() != REQUEST_ID_HEADER]
                headers.append((REQUEST_ID_HEADER, response_request_id(scope).encode("ascii")))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)


def client_request_id(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The request's first X-Request-Id when it is well-formed (CLIENT_REQUEST_ID), else None."""
    for name, value in headers:
        if name.lower() == REQUEST_ID_HEADER:
            value = value.strip()
            return value.decode("ascii") if CLIENT_REQUEST_ID.fullmatch(value) else None
    return None


def response_request_id(scope: Scope) -> str:
    """The id a response's X-Request-Id carries: the client's own when it sent a
    well-formed one, else the id a route gave the request (`request.state.request_id`: a
    generation's `chatcmpl-...`/`cmpl-...`, the response body's `id`, which the engine's
    log lines name), else a fresh `req-...`, kept for the rest of the request."""
    state = scope.setdefault("state", {})
    request_id = client_request_id(scope.get("headers") or []) or state.get(REQUEST_ID_STATE_KEY)
    if not isinstance(request_id, str):
        request_id = state[REQUEST_ID_STATE_KEY] = f"req-{uuid.uuid4().hex}"
    return request_id


class BodyLimitAndMetrics:
    def __init__(self, app: ASGIApp, max_body_bytes: int, http_metrics: HttpMetrics | None = None):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.http_metrics = http_metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {"code": 500}
        started = time.perf_counter()

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            headers = dict(scope.get("headers") or [])
            declared = headers.get(b"content-length")
            if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
                # A client waiting for 100 Continue has sent no body; one past the discard
                # limit would not be read to its end anyway.
                waiting = headers.get(b"expect", b"").lower() == b"100-continue"
                discard = not waiting and int(declared) <= DISCARD_LIMIT_BYTES
                return await self._too_large(send_counted, receive if discard else None)
            body, more = await self._read_body(receive)
            if more is None:
                return await self._too_large(send_counted, receive)
            replayed = False

            async def replay() -> Message:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()  # after the body: only http.disconnect comes

            await self.app(scope, replay, send_counted)
        finally:
            if self.http_metrics is not None:
                path, method = scope.get("path", ""), scope.get("method", "")
                self.http_metrics.observe(
                    path if path in KNOWN_HANDLERS else "other",
                    method if method in KNOWN_METHODS else "other",
                    status["code"],
                    time.perf_counter() - started,
                )

    async def _read_body(self, receive: Receive) -> tuple[bytes, bool | None]:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"".join(chunks), False
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return b"", None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), False

    async def _too_large(self, send: Send, discard_from: Receive | None) -> None:
        payload = json.dumps(
            error_body(
                413,
                f"request body is larger than the limit of {self.max_body_bytes} bytes (--max-body-bytes)",
                None,
                "request_too_large",
            )
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload, "more_body": discard_from is not None})
        if discard_from is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_discard_body(discard_from, DISCARD_LIMIT_BYTES), DISCARD_TIMEOUT_S)
        await send({"type": "http.response.body", "body": b""})


async def _discard_body(receive: Receive, limit: int) -> None:
    """Read the request body to its end (or a disconnect, or `limit` bytes) and drop it."""
    size = 0
    while size <= limit:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return
        size += len(message.get("body", b""))
