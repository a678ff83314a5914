"""Graceful shutdown (SIGTERM): refuse new work, let what is in flight finish, then stop.

Once `run` begins, readiness turns 503 (`draining`) and new generation requests get 503
with Retry-After; the requests in flight run to their end or until the shutdown timeout,
when the rest end as aborted (a stream still gets its final chunk and [DONE]).
"""

from __future__ import annotations

import asyncio
import logging
import time

from .core_client import EngineCoreClient, EngineUnavailable

log = logging.getLogger(__name__)


class Drain:
    """Graceful shutdown: refuse new work, let what is in flight finish, then stop."""

    def __init__(self, engine: EngineCoreClient, timeout_s: float):
        self.engine = engine
        self.timeout_s = timeout_s
        self.active = False

    def check(self) -> None:
        if self.active:
            raise EngineUnavailable("draining", "the server is shutting down; retry on another replica")

    async def run(self) -> None:
        """Begin draining and return once no request is in flight (or the timeout passed)."""
        self.active = True
        deadline = time.monotonic() + self.timeout_s
        log.info("draining: %d request(s) in flight, up to %.0f s", self.engine.num_live_requests, self.timeout_s)
        while self.engine.num_live_requests and self.engine.is_alive and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        aborted = self.engine.abort_all()
        if aborted:
            log.warning("drain timeout: %d request(s) ended as aborted", aborted)
            await asyncio.sleep(0.2)  # their final chunks go out before the server stops
        log.info("drained")
