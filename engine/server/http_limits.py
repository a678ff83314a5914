"""Time and size limits on HTTP connections, for the servers run with uvicorn.

uvicorn bounds only the wait between one response and the next request (keep-alive);
a connection that sends part of a request head, or stops partway through a body,
stays open forever. `HttpLimits.uvicorn_options()` adds, through an h11 protocol
subclass (limited_h11_protocol.py):

- a head timeout: from the connection's start, or a kept-alive connection's first byte
  of a request, to the end of that request's head. It is not restarted by each byte, so
  a client trickling its headers is cut off too; a partial head gets a 408.
- a body timeout: the longest silence while a request body arrives (while the app reads
  it: a server that has paused reading does not count against the client).
- the largest request head (h11's max incomplete event size; past it, a 400).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_HEADER_TIMEOUT_S = 30.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_KEEP_ALIVE_TIMEOUT_S = 5
DEFAULT_MAX_HEADER_BYTES = 64 << 10


@dataclass(slots=True, frozen=True)
class HttpLimits:
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    keep_alive_timeout_s: int = DEFAULT_KEEP_ALIVE_TIMEOUT_S
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ValueError(f"{name} must be a number of seconds in (0, 3600], got {value!r}")
        keep_alive = self.keep_alive_timeout_s
        if isinstance(keep_alive, bool) or not isinstance(keep_alive, int) or not 1 <= keep_alive <= 3600:
            raise ValueError(f"keep_alive_timeout_s must be a whole number of seconds in [1, 3600], got {keep_alive!r}")
        size = self.max_header_bytes
        if isinstance(size, bool) or not isinstance(size, int) or not 1024 <= size <= 16 << 20:
            raise ValueError(f"max_header_bytes must be an integer in [1024, {16 << 20}], got {size!r}")

    def uvicorn_options(self) -> dict[str, Any]:
        """Keyword arguments for `uvicorn.Config`."""
        from .limited_h11_protocol import LimitedH11Protocol  # uvicorn loads only where a server runs

        protocol = type("LimitedH11Protocol", (LimitedH11Protocol,), {"limits": self})
        return {
            "http": protocol,
            "timeout_keep_alive": self.keep_alive_timeout_s,
            "h11_max_incomplete_event_size": self.max_header_bytes,
        }
