"""uvicorn's h11 protocol with the head and body timeouts of `HttpLimits` (http_limits.py)."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import error_body

if TYPE_CHECKING:
    from .http_limits import HttpLimits


def _timeout_response() -> bytes:
    body = json.dumps(error_body(408, "the request head did not arrive in time", None, "request_timeout")).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class LimitedH11Protocol(H11Protocol):
    limits: ClassVar[HttpLimits]  # set by HttpLimits.uvicorn_options()

    _read_timer: asyncio.TimerHandle | None = None
    _timing_head = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_timer(self.limits.header_timeout_s, head=True)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return self._stop_timer()
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._start_timer(self.limits.body_timeout_s, head=False)
        elif state is h11.IDLE and self.conn.trailing_data[0]:
            if not self._timing_head:  # counted from the head's first byte, whatever follows
                self._start_timer(self.limits.header_timeout_s, head=True)
        else:
            self._stop_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def _start_timer(self, seconds: float, head: bool) -> None:
        self._stop_timer()
        self._timing_head = head
        self._read_timer = self.loop.call_later(seconds, self._on_read_timeout)

    def _stop_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        self._timing_head = False

    def _on_read_timeout(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if not self._timing_head and self.flow.read_paused:
            # The app has not read what came: the wait is the server's, not the client's.
            return self._start_timer(self.limits.body_timeout_s, head=False)
        if self._timing_head and self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self.transport.write(_timeout_response())
        self.transport.close()
