"""Pull the firing alerts about this node from Alertmanager's API v2.

Why pull: in a cluster Alertmanager reaches the agents through one Service, so a webhook
notification lands on whichever agent the Service picks, not on the node the alert is
about. Each agent instead asks

    GET /api/v2/alerts?active=true&silenced=false&inhibited=false
        &filter=<node_label>="<this node>"&filter=remediate="true"

and gets exactly the alerts it must act on. The API lists unresolved alerts only, so an
alert that was listed and no longer is has resolved (or expired): after it has been
missing for `resolve_after_s` (an Alertmanager replica that restarts with an empty store
must not resolve everything at once) the pull reports it resolved, with the startsAt it
fired with. Silenced and inhibited alerts are left out: a silence is how an operator
stops the agent acting on an incident.

With Alertmanager replicas (HA), give every replica's URL: the alert lists are merged by
fingerprint (the replicas receive the same alerts from Prometheus, with the same
fingerprint and startsAt), and a replica that does not answer is skipped for that poll. A
poll in which no replica answered says nothing (None), and nothing resolves.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from inferd.agent.remediation import Alert

log = logging.getLogger(__name__)

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(slots=True)
class PullConfig:
    urls: tuple[str, ...]
    node_label: str
    node_name: str
    matchers: dict[str, str] = field(default_factory=lambda: {"remediate": "true"})
    resolve_after_s: float = 30.0
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        self.urls = tuple(u.rstrip("/") for u in self.urls)
        if not self.urls:
            raise ValueError("no Alertmanager URL to pull alerts from")
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"Alertmanager URL must start with http:// or https://, got {url!r}")
        for name in (self.node_label, *self.matchers):
            if not _LABEL_NAME.match(name):
                raise ValueError(f"{name!r} is not a Prometheus label name")
        if not self.node_name:
            raise ValueError("the node name is empty")
        if self.resolve_after_s < 0 or self.timeout_s <= 0:
            raise ValueError("resolve_after_s must be >= 0 and timeout_s > 0")

    @property
    def filters(self) -> list[str]:
        pairs = {self.node_label: self.node_name, **self.matchers}
        return [f'{name}="{_escape(value)}"' for name, value in pairs.items()]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def parse_alerts(body: Any, source: str) -> list[Alert]:
    """Alerts of an API v2 `GET /alerts` answer (gettableAlerts); malformed items are skipped."""
    if not isinstance(body, list):
        raise ValueError(f"{source}: expected a JSON list of alerts, got {type(body).__name__}")
    alerts = []
    for index, item in enumerate(body):
        try:
            labels, annotations = item["labels"], item.get("annotations") or {}
            starts_at, fingerprint = item["startsAt"], item["fingerprint"]
            if not (
                isinstance(labels, dict)
                and isinstance(annotations, dict)
                and all(isinstance(v, str) for v in (*labels.values(), *annotations.values(), starts_at, fingerprint))
                and labels.get("alertname")
                and fingerprint
            ):
                raise TypeError
        except (KeyError, TypeError, AttributeError):
            log.warning("%s: alert %d is not a gettableAlert; skipped", source, index)
            continue
        alerts.append(Alert("firing", dict(labels), dict(annotations), starts_at, fingerprint))
    return alerts


class AlertPull:
    """Call `poll()` periodically: the firing alerts about this node, then those that resolved."""

    def __init__(self, config: PullConfig, clock: Callable[[], float] = time.time):
        self.config = config
        self._clock = clock
        self._http = httpx.Client(timeout=config.timeout_s)
        self._listed: dict[str, tuple[Alert, float]] = {}  # fingerprint -> (alert, last listed)
        self.polls_total: dict[str, int] = {"ok": 0, "failed": 0}

    def close(self) -> None:
        self._http.close()

    def seed(self, alerts: Iterable[Alert]) -> None:
        """Alerts known to be firing from before a restart: their absence resolves them too."""
        now = self._clock()
        for alert in alerts:
            self._listed.setdefault(alert.fingerprint, (alert, now))

    def fetch(self) -> list[Alert] | None:
        """The merged lists of every replica that answered; None when none did."""
        params: list[tuple[str, str | int | float | bool | None]] = [
            ("active", "true"),
            ("silenced", "false"),
            ("inhibited", "false"),
        ]
        params += [("filter", f) for f in self.config.filters]
        merged: dict[str, Alert] = {}
        answered = 0
        for url in self.config.urls:
            try:
                response = self._http.get(f"{url}/api/v2/alerts", params=params)
                response.raise_for_status()
                alerts = parse_alerts(response.json(), url)
            except (httpx.HTTPError, ValueError) as exc:
                log.warning("pulling alerts from %s failed: %s", url, exc)
                continue
            answered += 1
            for alert in alerts:
                merged.setdefault(alert.fingerprint, alert)
        self.polls_total["ok" if answered else "failed"] += 1
        return list(merged.values()) if answered else None

    def poll(self) -> list[Alert]:
        """Firing alerts (every one listed, each poll: the policy de-duplicates), then a
        resolved one for each that has been missing for resolve_after_s or came back with
        a new startsAt."""
        listed = self.fetch()
        if listed is None:
            return []
        now = self._clock()
        out: list[Alert] = []
        for alert in listed:
            previous = self._listed.get(alert.fingerprint)
            if previous is not None and previous[0].starts_at != alert.starts_at:
                out.append(_resolved(previous[0]))  # the old incident ended while we were not looking
            self._listed[alert.fingerprint] = (alert, now)
            out.append(alert)
        current = {a.fingerprint for a in listed}
        for fingerprint, (alert, seen) in list(self._listed.items()):
            if fingerprint not in current and now - seen >= self.config.resolve_after_s:
                del self._listed[fingerprint]
                out.append(_resolved(alert))
        return out


def _resolved(alert: Alert) -> Alert:
    return Alert("resolved", alert.labels, alert.annotations, alert.starts_at, alert.fingerprint)
