"""The stack's endpoints: their base URLs (fixed ports, as compose.yaml has them), whether
one answers, and the model name the engine serves."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

AGENT_URL = "http://localhost:10400"
ENGINE_URL = "http://localhost:8000"
PROMETHEUS_URL = "http://localhost:9090"
ALERTMANAGER_URL = "http://localhost:9093"
GRAFANA_URL = "http://localhost:3000"


def answers(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def served_model(engine_url: str, timeout_s: float = 2.0) -> str | None:
    """The model name clients send (`"model": ...`): the first id the engine's /v1/models
    lists; None when it does not answer."""
    try:
        with urllib.request.urlopen(f"{engine_url.rstrip('/')}/v1/models", timeout=timeout_s) as response:
            return str(json.load(response)["data"][0]["id"])
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError):
        return None
