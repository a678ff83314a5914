"""Small HTTP client for the engine's admin API (port 8000, bearer token).

    GET   /admin/config            -> the tunable parameters and their bounds
    PATCH /admin/config  {k: v}    -> applied between scheduler steps; 422 out of bounds
    POST  /admin/mode    {"mode"}  -> fast or fallback

Each answer carries the engine's bounds ({"max_num_seqs": {"min": 1, "max": 1024},
"mode": ["fast", "fallback"], ...}); the client keeps the latest, so the agent plans
within what the engine accepts rather than a table of its own.

The token comes from INFERD_ADMIN_TOKEN or a file (`token_from`), the same sources the
engine reads, so an agent and the engine it supervises share one secret.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

TOKEN_ENV = "INFERD_ADMIN_TOKEN"


class EngineError(RuntimeError):
    """The engine refused or could not be reached; `status` is the HTTP status or None."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def token_from(env: str = TOKEN_ENV, path: str | os.PathLike | None = None) -> str | None:
    if path:
        text = Path(path).read_text().strip()
        if not text:
            raise ValueError(f"admin token file {path} is empty")
        return text
    return os.environ.get(env) or None


class EngineClient:
    def __init__(self, base_url: str, token: str | None, timeout_s: float = 5.0):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"engine URL must start with http:// or https://, got {base_url!r}")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)
        self.bounds: dict[str, tuple[int, int]] = {}  # integer tunable -> (minimum, maximum), inclusive
        self.choices: dict[str, tuple[str, ...]] = {}  # enumerated tunable -> its values

    def close(self) -> None:
        self._http.close()

    def get_config(self) -> dict[str, Any]:
        return self._answer(self._call("GET", "/admin/config"))

    def patch_config(self, changes: dict[str, Any]) -> dict[str, Any]:
        if not changes:
            raise ValueError("patch_config needs at least one change")
        return self._answer(self._call("PATCH", "/admin/config", json=changes))

    def set_mode(self, mode: str) -> dict[str, Any]:
        if mode not in ("fast", "fallback"):
            raise ValueError(f"mode must be fast or fallback, got {mode!r}")
        return self._answer(self._call("POST", "/admin/mode", json={"mode": mode}))

    def _answer(self, body: Any) -> dict[str, Any]:
        """The config of an answer; its bounds, when it has them, are kept."""
        config = _config_of(body)
        if isinstance(body, dict) and isinstance(body.get("bounds"), dict):
            self.bounds, self.choices = _bounds_of(body["bounds"])
        return config

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise EngineError(f"{method} {self.base_url}{path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise EngineError(
                f"{method} {path}: HTTP {response.status_code}: {_detail(response)}", response.status_code
            )
        try:
            return response.json()
        except ValueError as exc:
            raise EngineError(f"{method} {path}: response is not JSON") from exc


def _config_of(body: Any) -> dict[str, Any]:
    # Accept both a bare mapping and {"config": {...}, ...}.
    if isinstance(body, dict) and isinstance(body.get("config"), dict):
        return body["config"]
    if isinstance(body, dict):
        return body
    raise EngineError(f"admin response is not an object: {body!r}")


def _bounds_of(bounds: dict[str, Any]) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[str, ...]]]:
    """{"name": {"min": a, "max": b}} ranges and {"name": [values]} choices; anything else is
    not a bound the agent can use, and is left out."""
    ranges: dict[str, tuple[int, int]] = {}
    choices: dict[str, tuple[str, ...]] = {}
    for name, bound in bounds.items():
        if isinstance(bound, dict) and all(
            isinstance(bound.get(k), int) and not isinstance(bound.get(k), bool) for k in ("min", "max")
        ):
            ranges[name] = (bound["min"], bound["max"])
        elif isinstance(bound, list) and all(isinstance(v, str) for v in bound):
            choices[name] = tuple(bound)
    return ranges, choices


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict):
        for key in ("detail", "error", "message"):
            if key in body:
                value = body[key]
                return value.get("message", str(value)) if isinstance(value, dict) else str(value)
    return str(body)[:200]
