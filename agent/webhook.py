"""Alertmanager webhook (`POST /v1/alerts`) and the action log (`GET /v1/actions`).

`make_router(state)` is the hook agent.server mounts: it builds the remediation
policy from the agent's arguments (`add_arguments` adds them), registers its metrics
and starts its clock. `make_webhook_router(state, policy, token_file)` puts the policy
and the token on the agent's state and returns the routes, which read them from there
(`request.app.state.agent`), as agent.server's routes read theirs.
The webhook takes Alertmanager's version-4 payload only with the bearer token from
`token_file` (re-read when the file changes; compared in constant time; the `Bearer`
scheme in any case, RFC 7235): 401 for a missing or wrong token, 413 for a body over
4 MiB, 400 for a body that is not a version-4 notification, 503 (with Retry-After) when
the audit log cannot be appended to (the policy records before it acts, so an alert it
cannot record is not acted on; Alertmanager retries). Each
alert goes to the policy, which is idempotent on fingerprint + startsAt + status and
ignores alerts it has no rule for (with a log line).
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from inferd.agent.audit import AuditLog, AuditLogConfig, AuditWriteError
from inferd.agent.remediation import Alert, PolicyConfig, RemediationPolicy

if TYPE_CHECKING:
    from inferd.agent.server import AgentState

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 << 20
AUDIT_RETRY_AFTER_S = 60  # a full disk is not freed in seconds


class TokenFile:
    """A bearer token kept in a file, re-read when the file's mtime or size changes.
    With no path every call is refused (the webhook is off)."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path else None
        self._stamp: tuple[int, int] | None = None
        self._token = b""
        if self.path is not None:
            self.read()  # fail at start-up, not at the first alert, when the file is missing

    def read(self) -> bytes:
        if self.path is None:
            raise ValueError("no --webhook-token-file given; the webhook is off")
        stat = self.path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            token = self.path.read_text().strip()
            if not token:
                raise ValueError(f"webhook token file {self.path} is empty")
            self._token, self._stamp = token.encode(), stamp
        return self._token

    def matches(self, authorization: str | None) -> bool:
        scheme, _, given = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        try:
            expected = self.read()
        except (OSError, ValueError) as exc:
            log.error("cannot read the webhook token: %s", exc)
            return False
        return hmac.compare_digest(given.strip().encode(), expected)


class PayloadError(ValueError):
    pass


def parse_notification(body: Any) -> list[Alert]:
    """The alerts of an Alertmanager version-4 notification, or PayloadError naming the fault."""
    if not isinstance(body, dict):
        raise PayloadError("body must be a JSON object")
    if body.get("version") != "4":
        raise PayloadError(f'unsupported payload version {body.get("version")!r}; expected "4"')
    alerts = body.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts must be a list")
    return [_parse_alert(i, a) for i, a in enumerate(alerts)]


def _parse_alert(index: int, raw: Any) -> Alert:
    where = f"alerts[{index}]"
    if not isinstance(raw, dict):
        raise PayloadError(f"{where} must be an object")
    status = raw.get("status")
    if status not in ("firing", "resolved"):
        raise PayloadError(f"{where}.status must be firing or resolved, got {status!r}")
    labels = raw.get("labels")
    if not _str_map(labels) or not labels.get("alertname"):
        raise PayloadError(f"{where}.labels must map strings to strings and include alertname")
    annotations = raw.get("annotations", {})
    if not _str_map(annotations):
        raise PayloadError(f"{where}.annotations must map strings to strings")
    for key in ("startsAt", "fingerprint"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise PayloadError(f"{where}.{key} must be a non-empty string")
    # JSON's \ud800 escape parses to a lone surrogate, which no UTF-8 response or audit
    # reader could carry: refuse it here, before the alert is logged.
    for name, mapping in (("labels", labels), ("annotations", annotations)):
        for key, text in mapping.items():
            if not (_is_unicode(key) and _is_unicode(text)):
                field = f"{where}.{name}.{key}" if _is_unicode(key) else f"{where}.{name}"
                raise PayloadError(f"{field} is not valid Unicode text (it holds a lone surrogate such as \\ud800)")
    for key in ("startsAt", "fingerprint"):
        if not _is_unicode(raw[key]):
            raise PayloadError(f"{where}.{key} is not valid Unicode text (it holds a lone surrogate such as \\ud800)")
    return Alert(status, dict(labels), dict(annotations), raw["startsAt"], raw["fingerprint"])


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _str_map(value: Any) -> TypeGuard[dict[str, str]]:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None once it passes `limit` bytes (read no further)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


# ---- the OpenAPI description (the handlers parse the body themselves) ----

_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
# What parse_notification checks; Alertmanager's other fields (receiver, groupLabels,
# endsAt, generatorURL, ...) are read by nobody here and may be anything.
NOTIFICATION_SCHEMA = {
    "type": "object",
    "required": ["version", "alerts"],
    "properties": {
        "version": {"const": "4"},
        "alerts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["status", "labels", "startsAt", "fingerprint"],
                "properties": {
                    "status": {"enum": ["firing", "resolved"]},
                    "labels": {
                        **_STRINGS,
                        "required": ["alertname"],
                        "properties": {"alertname": {"type": "string", "minLength": 1}},
                    },
                    "annotations": _STRINGS,
                    "startsAt": {"type": "string", "minLength": 1},
                    "fingerprint": {"type": "string", "minLength": 1},
                },
            },
        },
    },
}
_RESULTS = {
    "type": "object",
    "required": ["results"],
    "properties": {"results": {"type": "array", "items": {"type": "object", "required": ["result"]}}},
}
_ALERTS_DOC: dict[str, Any] = dict(  # router.post's keyword arguments
    responses={
        200: {
            "description": "what the policy did with each alert",
            "content": {"application/json": {"schema": _RESULTS}},
        },
        400: {
            "description": "the body is not JSON (or not UTF-8, or nests too deeply), or not a version-4 "
            "notification, or holds a lone surrogate"
        },
        401: {"description": "the Authorization header is missing, not Bearer, or has the wrong token"},
        413: {"description": f"the body is over {MAX_BODY_BYTES} bytes"},
        503: {
            "description": "the audit log cannot be appended to (full disk, I/O error); the alert named "
            "and those after it were not handled; retry after Retry-After seconds"
        },
        500: {"description": "the policy failed on an alert (the agent's log says why)"},
    },
    openapi_extra={
        "security": [{"webhookToken": []}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": NOTIFICATION_SCHEMA}}},
    },
)
_ACTIONS = {
    "type": "object",
    "required": ["records", "verifying", "dry_run"],
    "properties": {
        "records": {"type": "array", "items": {"type": "object"}},
        "verifying": {"type": "array", "items": {"type": "string"}},
        "dry_run": {"type": "boolean"},
        "unreadable_lines": {"type": "integer"},
    },
}


class AlertHandler(Protocol):
    """What the routes need of a policy: a RemediationPolicy, or agent.kubernetes'
    NodeRemediation, which routes each alert to the policy of an engine pod."""

    audit: AuditLog
    config: PolicyConfig

    @property
    def verifying(self) -> list[str]: ...

    def handle(self, alert: Alert) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Webhook:
    """What the routes read from the app's state (`agent.extra["webhook"]`): the policy
    the alerts go to and the token a call must carry."""

    policy: AlertHandler
    token: TokenFile


def _webhook(request: Request) -> Webhook:
    return request.app.state.agent.extra["webhook"]


# The routes read the app's `agent` (an AgentState) as agent.server's do; make_webhook_router
# puts the Webhook there.
router = APIRouter()


@router.post("/v1/alerts", **_ALERTS_DOC)
async def receive_alerts(request: Request):
    webhook = _webhook(request)
    if not webhook.token.matches(request.headers.get("authorization")):
        log.warning(
            "webhook call from %s with a missing or wrong token; refused",
            request.client.host if request.client else "?",
        )
        return JSONResponse(
            {"error": "missing or wrong bearer token"}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
        )
    raw = await _read_body(request, MAX_BODY_BYTES)
    if raw is None:
        return JSONResponse(
            {"error": f"body over {MAX_BODY_BYTES} bytes"}, status_code=413, headers={"Connection": "close"}
        )
    try:
        alerts = parse_notification(json.loads(raw))
    # JSONDecodeError and UnicodeDecodeError are ValueErrors; RecursionError: nested too deep.
    except (ValueError, PayloadError, RecursionError) as exc:
        return JSONResponse({"error": f"malformed Alertmanager payload: {exc}"}, status_code=400)
    results = []
    for index, alert in enumerate(alerts):
        try:
            results.append(await run_in_threadpool(webhook.policy.handle, alert))
        except AuditWriteError as exc:
            log.error("alert %s not handled: %s", alert.name, exc)
            before = " (the ones before it were)" if index else ""
            return JSONResponse(
                {"error": f"{exc}; alerts[{index}] and any after it were not handled{before}"},
                status_code=503,
                headers={"Retry-After": str(AUDIT_RETRY_AFTER_S)},
            )
    return JSONResponse({"results": results})


@router.get(
    "/v1/actions",
    responses={
        200: {
            "description": "the audit log's last records (kept in memory)",
            "content": {"application/json": {"schema": _ACTIONS}},
        },
        422: {"description": "limit is not an integer in [0, 100000]"},
        503: {"description": "the audit log cannot be read"},
    },
)
def list_actions(request: Request, limit: int = Query(200, ge=0, le=100_000)):
    """The audit log, oldest first (the last `limit` records kept in memory; 0 for all of them)."""
    policy = _webhook(request).policy
    try:
        records = policy.audit.tail(limit)
    except OSError as exc:
        raise HTTPException(status_code=503, detail=f"audit log unreadable: {exc}") from exc
    return {
        "records": records,
        "verifying": policy.verifying,
        "dry_run": policy.config.dry_run,
        "unreadable_lines": policy.audit.unreadable_lines,
    }


def make_webhook_router(state: AgentState, policy: AlertHandler, token_file: str | os.PathLike | None) -> APIRouter:
    """The webhook's routes, with `policy` and the token in `token_file` put on `state` for
    them; the token file is read now, so a missing one fails at start-up."""
    state.extra["webhook"] = Webhook(policy, TokenFile(token_file))
    return router


# ---- the agent's hook ------------------------------------------------------------------


def default_audit_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "inferd" / "audit.jsonl"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("remediation", "Alertmanager webhook and remediation policy")
    group.add_argument(
        "--webhook-token-file",
        type=Path,
        help="bearer token Alertmanager sends to /v1/alerts (without it the webhook refuses every call)",
    )
    group.add_argument(
        "--audit-log",
        type=Path,
        default=None,
        help=f"JSON-lines audit log of remediation decisions (default {default_audit_path()})",
    )
    defaults = AuditLogConfig()
    group.add_argument(
        "--audit-max-bytes",
        type=int,
        default=defaults.max_bytes,
        help=f"rotate the audit log before it passes this size (default {defaults.max_bytes}, at least 65536)",
    )
    group.add_argument(
        "--audit-keep-files",
        type=int,
        default=defaults.keep_files,
        help=f"rotated audit log files kept (audit.jsonl.1, .2, ...; default {defaults.keep_files})",
    )
    group.add_argument("--dry-run", action="store_true", help="record remediation decisions without acting")
    group.add_argument(
        "--prometheus-url",
        default="http://127.0.0.1:9090",
        help="Prometheus that verification queries (default http://127.0.0.1:9090)",
    )
    group.add_argument(
        "--remediation-config",
        type=Path,
        help="YAML of remediation settings (bounds, cooldown_s, verify_window_s, ...; see agent/remediation_rules.py)",
    )
    group.add_argument(
        "--admin-token-file",
        type=Path,
        help="engine admin token (else INFERD_ADMIN_TOKEN; else one is generated for the supervised engine)",
    )


def audit_log_from(args: argparse.Namespace) -> AuditLog:
    """The agent's audit log from its arguments; AuditLogError when it cannot be appended to."""
    defaults = AuditLogConfig()
    config = AuditLogConfig(
        max_bytes=getattr(args, "audit_max_bytes", defaults.max_bytes),
        keep_files=getattr(args, "audit_keep_files", defaults.keep_files),
    )
    return AuditLog(getattr(args, "audit_log", None) or default_audit_path(), config=config)


def build_policy(args: argparse.Namespace, engine_url: str | None, supervisor=None) -> RemediationPolicy:
    from inferd.agent.engine_client import TOKEN_ENV, EngineClient, token_from
    from inferd.agent.engine_host import SupervisorHost
    from inferd.agent.prometheus import PrometheusClient
    from inferd.agent.remediation_config import load_policy_config

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per engine/Prometheus call is noise
    config = load_policy_config(args)
    token = token_from(path=getattr(args, "admin_token_file", None))
    if token is None and supervisor is not None:
        token = secrets.token_hex(32)
        log.info("no engine admin token configured; generated one for the supervised engine")
    if token is not None:
        # The supervised engine inherits the agent's environment when it is (re)started.
        os.environ[TOKEN_ENV] = token
    engine = EngineClient(engine_url, token) if engine_url and token else None
    host = (
        SupervisorHost(supervisor, getattr(args, "sysfs_root", "/sys"), getattr(args, "procfs_root", "/proc"))
        if supervisor is not None
        else None
    )
    audit = audit_log_from(args)
    return RemediationPolicy(engine, audit, config, PrometheusClient(args.prometheus_url), host=host)


def make_router(state: AgentState) -> APIRouter:
    """The hook agent.server mounts: the policy from the agent's arguments, and its clock.
    Its metrics are the `remediation` collector's (agent.collectors.remediation), built
    from `state.extra["remediation"]` once this has run."""
    args = state.extra.get("args") or argparse.Namespace(prometheus_url="http://127.0.0.1:9090")
    policy = build_policy(args, None if getattr(args, "no_engine", False) else state.engine_url, state.supervisor)
    state.extra["remediation"] = policy
    policy.start()
    token_file = getattr(args, "webhook_token_file", None)
    if token_file is None:
        log.warning("no --webhook-token-file: /v1/alerts refuses every call")
    log.info("remediation: audit log %s%s", policy.audit.path, " (dry run)" if policy.config.dry_run else "")
    return make_webhook_router(state, policy, token_file)
