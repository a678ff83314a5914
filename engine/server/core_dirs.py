"""The folders under the temporary directory that hold the engine core channels' sockets.

Each is named after the server process that made it (`inferd-core-<pid>-<random>`), so
a folder whose server is gone (killed with SIGKILL, never reaching its shutdown) is
known to be stale: the next server removes such folders when it starts.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "inferd-core-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-")


def make_core_dir(root: str | None = None) -> str:
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root)


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_core_dirs(root: str | None = None) -> list[str]:
    """Remove this user's core folders whose server process has exited; the removed paths.
    A folder named without a pid is left alone: nothing says whose it is."""
    removed = []
    uid = os.getuid()
    for path in Path(root or tempfile.gettempdir()).glob(f"{PREFIX}*"):
        match = _NAME.match(path.name)
        try:
            if not match or not path.is_dir() or path.is_symlink() or path.stat().st_uid != uid:
                continue
        except OSError:
            continue
        pid = int(match.group(1))
        if pid == os.getpid() or _is_running(pid):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(str(path))
    if removed:
        log.info("removed %d stale engine core folder(s) left by exited servers: %s", len(removed), ", ".join(removed))
    return removed
