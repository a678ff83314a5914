"""The stack's bearer tokens: the webhook token Alertmanager sends to the agent (the file
alerts/alertmanager.yml names, or one under the run directory with a copy of that config
naming it) and the engine's admin token (`admin-token` in the run directory). Each is a
fresh random token, mode 0600, made once and kept across restarts."""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from .config import REPO

ADMIN_TOKEN_FILE = "admin-token"


def token_file() -> Path:
    """The bearer-token file alerts/alertmanager.yml sends to the agent's webhook."""
    text = (REPO / "alerts" / "alertmanager.yml").read_text()
    match = re.search(r"credentials_file:\s*(\S+)", text)
    if match is None:
        raise RuntimeError("alerts/alertmanager.yml names no credentials_file for the agent's webhook")
    path = Path(match.group(1))
    return path if path.is_absolute() else REPO / "alerts" / path


def ensure_token(
    path: Path, what: str = "the webhook token", named_in: str = " (named in alerts/alertmanager.yml)"
) -> None:
    """Create `path` holding a fresh random token, mode 0600, unless it exists."""
    if path.exists():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except PermissionError as exc:
        raise RuntimeError(
            f"cannot create {what} {path}{named_in}: {exc}; run once as root or create it yourself"
        ) from exc
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))


def _usable(path: Path) -> bool:
    """The file can be read, or created by us (its nearest existing folder is writable)."""
    if path.exists():
        return os.access(path, os.R_OK)
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    return os.access(folder, os.W_OK)


def webhook_config(run_dir: Path) -> tuple[Path, Path]:
    """(webhook token file, Alertmanager config) for the stack. The token
    alerts/alertmanager.yml names (/etc/inferd/webhook-token, shared with compose.yaml)
    when this user may use it; otherwise a token under the run directory and a copy of the
    config naming it, so the stack also runs as a user who may not write /etc."""
    shared = token_file()
    config = REPO / "alerts" / "alertmanager.yml"
    if _usable(shared):
        return shared, config
    token, local = run_dir / "webhook-token", run_dir / "alertmanager.yml"
    text = re.sub(r"(credentials_file:\s*)\S+", lambda m: m.group(1) + str(token), config.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    local.write_text(text)
    return token, local


def admin_token_path(run_dir: Path) -> Path:
    """The engine's admin token under the stack's run directory (made by `up`)."""
    return run_dir / ADMIN_TOKEN_FILE
