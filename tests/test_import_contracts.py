"""The layers hold: import-linter's contracts in .importlinter (the engine stands alone, the
exporters sit below the agent, the dashboards import none of them, no cycles in the engine)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lint_imports() -> str:
    found = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(found).exists():
        pytest.skip("import-linter not installed (pip install import-linter; the test extra has it)")
    return found


def test_import_contracts_are_kept():
    result = subprocess.run([lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_a_forbidden_import_breaks_a_contract(tmp_path):
    """The check can fail: the same contracts over a copy where the engine imports the agent."""
    for package in ("engine", "agent", "exporters", "dashboards", "ebpf"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    (tmp_path / "engine" / "leak.py").write_text("from agent import supervisor  # noqa: F401\n")
    result = subprocess.run(
        [lint_imports(), "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode != 0
    assert "The engine never imports the agent" in result.stdout and "BROKEN" in result.stdout
