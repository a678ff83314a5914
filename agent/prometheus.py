"""The agent's one client of Prometheus' HTTP API: instant and range queries.

    GET /api/v1/query        ?query=                     -> a vector (remediation's targets)
    GET /api/v1/query_range  ?query=&start=&end=&step=   -> a matrix (the doctor, the report)

Two ways to fail, for two kinds of caller. `query` and `query_range` raise
`PrometheusError` (refused, failed or unreachable), so a report or a doctor run says why it
has no data. `samples` and `value` log the failure and answer None: the remediation policy
asks between engine changes and must go on without an answer (acting unverified).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import httpx

log = logging.getLogger(__name__)


class PrometheusError(RuntimeError):
    """Prometheus refused or failed a query, or could not be reached."""


class PrometheusClient:
    def __init__(self, base_url: str, timeout_s: float = 5.0):
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The `result` of an instant query: [{"metric": {...}, "value": [t, "v"]}, ...]."""
        return self._get("/api/v1/query", {"query": expr}, expr)

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        """The `result` of a range query: [{"metric": {...}, "values": [[t, "v"], ...]}, ...]."""
        return self._get("/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step_s}, expr)

    def samples(self, expr: str) -> list[float] | None:
        """The finite sample values of an instant query; None when the query failed."""
        try:
            result = self.query(expr)
        except (PrometheusError, ValueError) as exc:
            log.warning("prometheus query %r failed: %s", expr, exc)
            return None
        values = [float(sample["value"][1]) for sample in result if "value" in sample]
        return [v for v in values if math.isfinite(v)]

    def value(self, expr: str) -> float | None:
        """The largest sample; None if the result is empty or the query failed."""
        values = self.samples(expr)
        return max(values) if values else None

    def _get(self, path: str, params: dict[str, Any], expr: str) -> list[dict[str, Any]]:
        try:
            response = self._http.get(path, params=params)
        except httpx.HTTPError as exc:
            raise PrometheusError(f"cannot reach Prometheus at {self.base_url}: {exc}") from exc
        if response.status_code >= 400:
            raise PrometheusError(f"Prometheus refused {expr!r}: {response.text}")
        body = response.json()  # ValueError when it is not JSON
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else body
            raise PrometheusError(f"Prometheus query failed: {error}")
        return body.get("data", {}).get("result", [])
