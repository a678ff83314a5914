"""Alerts about this node, routed to one remediation policy per engine pod.

Every engine pod gets its own `RemediationPolicy` (its admin API, its episodes, its
verifications; Prometheus queries narrowed to its `instance`), all writing one audit log:
each pod's records carry `pod` and `pod_uid`, and a policy reads back only its own pod's
on start (`PodAuditLog`), so a replacement pod starts with a clean slate while its
predecessor's story stays in the log.

Routing (`NodeRemediation.handle`), for the alerts of the pull and of the webhook alike:

    its node label is not this node              -> other_node (not recorded: not ours)
    already routed (fingerprint + startsAt + status, rebuilt from the log on start) -> duplicate
    about one engine (a `pod` label, or the engine's job): the pod with that
    namespace/pod or that instance, if it runs here; none -> no_engine
    about the node (the agent's series, or `host` only): every engine pod here; a
    restart alert (InferdEngineDown) only the pods whose /ready does not say ready

then a `routed` record (the intent, before any policy acts) and each pod's policy
handles it. The resolved notification goes to the pods its firing one went to.

`PodHost` is the policy's EngineHost for a pod: `restart_engine` deletes the pod so that
its controller replaces it, only when its /ready still says engine_stalled, engine_dead or
does not answer (never while loading or draining), only once its containers have been
running for `startup_grace_s` (a pod still pulling its image or starting its server does
not answer either), and at most `max_deletions` per `deletion_window_s` on this node. It offers no `rebind_engine`: the kubelet's CPU,
Memory and Topology Managers place a pod, and the agent reports a misplaced one
(inferd_pod_numa_misaligned) instead of moving it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import httpx

from inferd.agent.audit import AuditLog
from inferd.agent.kubernetes.discovery import EnginePod, PodDiscovery
from inferd.agent.remediation import Alert, PolicyConfig, RemediationPolicy, Rule

log = logging.getLogger(__name__)

READY_STATES = ("ready", "loading", "engine_stalled", "engine_dead", "draining", "unreachable")
DELETABLE = ("engine_stalled", "engine_dead", "unreachable")


class PodAuditLog(AuditLog):
    """One pod's view of the node's audit log: appends carry the pod, reads return its own.
    Everything goes through the node's log, the file's one owner (its lock, rotation and
    in-memory records)."""

    def __init__(self, node_log: AuditLog, pod: EnginePod):  # no super().__init__: it owns nothing
        self.node_log = node_log
        self.path = node_log.path
        self.config = node_log.config
        self.pod = pod

    @property
    def unreadable_lines(self) -> int:  # type: ignore[override]  # read-only: the node log counts
        return self.node_log.unreadable_lines

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        return self.node_log.append(event, pod=self.pod.key, pod_uid=self.pod.uid, **fields)

    def read(self) -> list[dict[str, Any]]:
        return [r for r in self.node_log.read() if r.get("pod_uid") == self.pod.uid]

    def tail(self, limit: int) -> list[dict[str, Any]]:
        own = [r for r in self.node_log.tail(0) if r.get("pod_uid") == self.pod.uid]
        return own[-limit:] if limit > 0 else own


def probe_ready(url: str, timeout_s: float = 2.0) -> str:
    """The engine's /ready as one of READY_STATES (its 503 error code names the state)."""
    try:
        response = httpx.get(f"{url}/ready", timeout=timeout_s)
    except httpx.HTTPError:
        return "unreachable"
    if response.status_code == 200:
        return "ready"
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    return code if code in READY_STATES else "unreachable"


class DeletionLimiter:
    """At most `limit` pod deletions per `window_s` on this node (a bad rule or a flapping
    probe must not delete every engine); rebuilt from the audit log's applied deletions."""

    def __init__(self, limit: int, window_s: float, clock: Callable[[], float] = time.time):
        if limit < 0 or window_s <= 0:
            raise ValueError("pod deletions: limit must be >= 0 and window_s > 0")
        self.limit, self.window_s, self._clock = limit, window_s, clock
        self._times: deque[float] = deque()
        self._lock = threading.Lock()

    def note(self, ts: float) -> None:
        with self._lock:
            self._times.append(ts)

    def take(self) -> str | None:
        """None and one deletion counted, or why not now."""
        with self._lock:
            now = self._clock()
            while self._times and now - self._times[0] >= self.window_s:
                self._times.popleft()
            if len(self._times) >= self.limit:
                return f"{len(self._times)} pod deletion(s) on this node in the last {self.window_s:g}s (limit {self.limit})"
            self._times.append(now)
            return None


class PodHost:
    """The policy's EngineHost for one engine pod: restarting it is deleting it."""

    def __init__(
        self,
        pod: EnginePod,
        discovery: PodDiscovery,
        limiter: DeletionLimiter,
        probe: Callable[[str], str] = probe_ready,
        startup_grace_s: float = 120.0,
        clock: Callable[[], float] = time.time,
    ):
        self.pod, self.discovery, self.limiter, self.probe = pod, discovery, limiter, probe
        self.startup_grace_s = startup_grace_s
        self._clock = clock

    def restart_engine(self) -> str:
        pod = self.pod
        fresh = self.discovery.get(pod)
        if fresh is None:
            return f"pod {pod.key} (uid {pod.uid}) is gone already; its controller replaces it"
        if fresh.is_deleting:
            return f"pod {pod.key} is being deleted already"
        if fresh.started_at is None:
            raise RuntimeError(f"pod {pod.key} is {fresh.phase} with a container not running; not deleted")
        running_s = self._clock() - fresh.started_at
        if running_s < self.startup_grace_s:
            raise RuntimeError(
                f"pod {pod.key} started {running_s:.0f}s ago (grace {self.startup_grace_s:g}s); not deleted"
            )
        state = self.probe(fresh.url) if fresh.url else "unreachable"
        if state not in DELETABLE:
            # Failing (rather than succeeding with nothing done) spends no cooldown.
            raise RuntimeError(f"pod {pod.key} is {state}; not deleted")
        why = self.limiter.take()
        if why is not None:
            raise RuntimeError(f"pod {pod.key} is {state} but not deleted: {why}")
        self.discovery.delete(fresh)
        log.warning("deleted engine pod %s (uid %s): %s", pod.key, pod.uid, state)
        return f"deleted pod {pod.key} (uid {pod.uid}, {state}); its controller starts a replacement"


class NodeRemediation:
    """What the webhook router and the pull call `handle` on in Kubernetes mode. It also
    answers what `/v1/actions` and the remediation collector read of a policy, over all pods."""

    def __init__(
        self,
        node_name: str,
        node_label: str,
        audit: AuditLog,
        config: PolicyConfig,
        make_policy: Callable[[EnginePod, PolicyConfig, AuditLog], RemediationPolicy],
        engine_job: str = "inferd-engine",
        rules: dict[str, Rule] | None = None,
    ):
        from inferd.agent.remediation_rules import DEFAULT_RULES

        self.node_name, self.node_label, self.engine_job = node_name, node_label, engine_job
        self.audit = audit
        self.config = config
        self.rules = DEFAULT_RULES if rules is None else rules
        self._make_policy = make_policy
        self._lock = threading.RLock()
        self._pods: dict[str, EnginePod] = {}  # uid -> pod
        self._policies: dict[str, RemediationPolicy] = {}  # uid -> its policy
        self._readiness: dict[str, str] = {}  # uid -> last /ready state
        self._routed: set[str] = set()  # alert keys
        self._routed_to: dict[str, list[str]] = {}  # fingerprint -> pod uids its firing alert went to
        self._firing: dict[str, Alert] = {}  # fingerprint -> firing alert routed, not resolved
        self._reload(audit.read())

    # -- pods --

    def update_pods(self, pods: Iterable[EnginePod], readiness: dict[str, str] | None = None) -> None:
        """The node's engine pods now (discovery) and their /ready states (by uid)."""
        pods = list(pods)
        with self._lock:
            current = {p.uid: p for p in pods}
            for uid in [u for u in self._pods if u not in current]:
                policy = self._policies.pop(uid, None)
                if policy is not None:
                    _close(policy)
                log.info("engine pod %s left this node", self._pods.pop(uid).key)
            for uid, pod in current.items():
                known = self._pods.get(uid)
                if known is None or known.instance != pod.instance:
                    old = self._policies.pop(uid, None)
                    if old is not None:
                        _close(old)
                    config = dataclasses.replace(
                        self.config, engine_selector=f'{self.config.engine_selector},instance="{pod.instance}"'
                    )
                    self._policies[uid] = self._make_policy(pod, config, PodAuditLog(self.audit, pod))
                    log.info("engine pod %s at %s: remediation policy ready", pod.key, pod.url)
                self._pods[uid] = pod
            self._readiness = dict(readiness or {})

    @property
    def pods(self) -> list[EnginePod]:
        with self._lock:
            return sorted(self._pods.values(), key=lambda p: p.key)

    def policy_of(self, pod: EnginePod) -> RemediationPolicy | None:
        with self._lock:
            return self._policies.get(pod.uid)

    def stop(self) -> None:
        with self._lock:
            for policy in self._policies.values():
                _close(policy)

    def start(self) -> None:
        """Policies start as pods are found (update_pods); nothing runs before."""

    # -- alerts --

    def handle(self, alert: Alert) -> dict[str, Any]:
        base = {"alert": alert.name, "status": alert.status}
        node = alert.labels.get(self.node_label)
        if node != self.node_name:
            log.debug("alert %s is about node %r, not %r; left to that node's agent", alert.name, node, self.node_name)
            return {**base, "result": "other_node", "node": node}
        with self._lock:
            if alert.key in self._routed:
                return {**base, "result": "duplicate"}
            targets = self._targets(alert)
            uids = [p.uid for p in targets]
            self.audit.append(  # recorded before it counts as routed, so a retry after a failed append is routed
                "routed",
                alert=alert.name,
                status=alert.status,
                fingerprint=alert.fingerprint,
                starts_at=alert.starts_at,
                labels=alert.labels,
                pods=[p.key for p in targets],
                pod_uids=uids,
            )
            self._routed.add(alert.key)
            if alert.status == "firing":
                self._routed_to[alert.fingerprint] = uids
                self._firing[alert.fingerprint] = alert
            else:
                self._routed_to.pop(alert.fingerprint, None)
                self._firing.pop(alert.fingerprint, None)
            policies = [(p, self._policies[p.uid]) for p in targets if p.uid in self._policies]
        if not policies:
            log.info("alert %s %s on %s: no engine pod to act on", alert.name, alert.status, self.node_name)
            return {**base, "result": "no_engine"}
        results = {pod.key: policy.handle(alert) for pod, policy in policies}
        if len(results) == 1:
            ((key, result),) = results.items()
            return {**result, "pod": key}
        return {**base, "result": "per_pod", "pods": results}

    def _targets(self, alert: Alert) -> list[EnginePod]:
        labels = alert.labels
        pods = sorted(self._pods.values(), key=lambda p: p.key)
        if alert.status == "resolved" and alert.fingerprint in self._routed_to:
            uids = self._routed_to[alert.fingerprint]
            return [p for p in pods if p.uid in uids]
        if labels.get("pod"):
            return [p for p in pods if p.name == labels["pod"] and labels.get("namespace", p.namespace) == p.namespace]
        if labels.get("job") == self.engine_job:
            return [p for p in pods if p.instance == labels.get("instance")]
        rule = self.rules.get(alert.name)
        if rule is not None and rule.kind == "restart" and alert.status == "firing":
            return [p for p in pods if self._readiness.get(p.uid, "unreachable") in DELETABLE]
        return [p for p in pods if not p.is_deleting]

    @property
    def firing(self) -> list[Alert]:
        with self._lock:
            return list(self._firing.values())

    def _reload(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            if r.get("event") != "routed":
                continue
            fingerprint, status = r.get("fingerprint", ""), r.get("status")
            self._routed.add(f"{fingerprint}|{r.get('starts_at')}|{status}")
            if status == "firing":
                self._routed_to[fingerprint] = list(r.get("pod_uids") or [])
                labels = r.get("labels") or {"alertname": r.get("alert", "")}
                self._firing[fingerprint] = Alert("firing", labels, {}, r.get("starts_at", ""), fingerprint)
            else:
                self._routed_to.pop(fingerprint, None)
                self._firing.pop(fingerprint, None)

    # -- what /v1/actions and the remediation collector read, over every pod --

    def _all(self) -> list[RemediationPolicy]:
        with self._lock:
            return list(self._policies.values())

    @property
    def verifying(self) -> list[str]:
        return sorted(v for p in self._all() for v in p.verifying)

    @property
    def actions_total(self) -> dict[tuple[str, str, str], int]:
        return _summed(p.actions_total for p in self._all())

    @property
    def skipped_total(self) -> dict[tuple[str, str], int]:
        return _summed(p.skipped_total for p in self._all())

    @property
    def rollbacks_total(self) -> dict[str, int]:
        return _summed(p.rollbacks_total for p in self._all())

    @property
    def last_action_ts(self) -> dict[str, float]:
        latest: dict[str, float] = {}
        for policy in self._all():
            for action, ts in dict(policy.last_action_ts).items():
                latest[action] = max(ts, latest.get(action, ts))
        return latest

    @property
    def _episodes(self) -> dict[str, Any]:
        return {f"{uid}|{fp}": e for uid, p in list(self._policies.items()) for fp, e in dict(p._episodes).items()}

    @property
    def _in_force(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for policy in self._all():
            merged.update(policy.in_force)
        return merged


def _close(policy: RemediationPolicy) -> None:
    """Stop a pod's policy and close its engine connection (the pod left, or moved)."""
    policy.stop()
    close = getattr(policy.engine, "close", None)
    if close is not None:
        close()


def _summed(counts: Iterable[dict]) -> dict:
    total: dict = {}
    for one in counts:
        for key, value in dict(one).items():
            total[key] = total.get(key, 0) + value
    return total
