"""The engine core channels' socket folders: named after their server's pid, and the ones
a killed server left behind removed when the next server starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from inferd.engine.server.core_dirs import make_core_dir, remove_stale_core_dirs

from server_fixtures import running_server


def exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_folders_of_exited_servers_are_removed(tmp_path):
    dead = tmp_path / f"inferd-core-{exited_pid()}-abc"
    dead.mkdir()
    (dead / "in").touch()  # where the socket was
    ours = Path(make_core_dir(str(tmp_path)))
    assert ours.name.startswith(f"inferd-core-{os.getpid()}-")
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live_server:
        try:
            live = tmp_path / f"inferd-core-{live_server.pid}-def"
            live.mkdir()
            unnamed = tmp_path / "inferd-core-q1w2e3"  # no pid in the name: whose is unknown
            unnamed.mkdir()
            other = tmp_path / f"not-inferd-{exited_pid()}-x"
            other.mkdir()

            assert remove_stale_core_dirs(str(tmp_path)) == [str(dead)]
            assert not dead.exists()
            assert ours.is_dir() and live.is_dir() and unnamed.is_dir() and other.is_dir()
        finally:
            live_server.kill()


def test_a_starting_server_removes_the_folder_a_killed_one_left(tiny_model):
    stale = Path(tempfile.gettempdir()) / f"inferd-core-{exited_pid()}-stale"
    stale.mkdir()
    (stale / "out").touch()
    try:
        with running_server(tiny_model):
            assert not stale.exists()
            assert list(stale.parent.glob(f"inferd-core-{os.getpid()}-*"))  # the running server's own
    finally:
        shutil.rmtree(stale, ignore_errors=True)
